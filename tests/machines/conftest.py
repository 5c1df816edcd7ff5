"""The local provider's stand-in worker process, for tests that power machines on."""

from __future__ import annotations

import textwrap

import pytest


@pytest.fixture
def fake_worker_command(settings, tmp_path):
    """Point the local provider at a stand-in for manage.py that records its start and
    then lives until told to stop, the way a worker process would."""
    settings.LOCAL_MACHINES_DIR = str(tmp_path / "machines")
    base = tmp_path / "app"
    base.mkdir()
    (base / "manage.py").write_text(
        textwrap.dedent(
            """
            import os, sys, time, pathlib
            out = pathlib.Path(sys.argv[0]).parent / "starts"
            with out.open("a") as f:
                f.write(f"{sys.argv[1:]} {os.environ['HUBDOMMED_WORKER_CREDENTIAL']}\\n")
            stop = pathlib.Path(sys.argv[0]).parent / "stop"
            while not stop.exists():
                time.sleep(0.05)
            """
        )
    )
    settings.BASE_DIR = base
    yield base
    (base / "stop").write_text("")
