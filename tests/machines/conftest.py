"""The local provider's stand-in worker process, for tests that power machines on."""

from __future__ import annotations

import textwrap
from pathlib import Path

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


def fake_workers_running(base: Path) -> int:
    """How many processes run the fake ``manage.py`` in ``base`` right now.

    A fake worker runs until its ``stop`` file appears, so every one started is counted:
    a process spawned by mistake shows up here, whether or not it wrote its line yet.
    """
    script = str(base / "manage.py").encode()
    running = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        running += script in argv
    return running
