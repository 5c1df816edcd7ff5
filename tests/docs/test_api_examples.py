"""The authentication examples of docs/api.md work as written against the real API, in bash
and zsh: a platform admin logs in, reads /me with the access token, and refreshes."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from django.contrib.auth import get_user_model

from tests.docs.test_readme import section
from tests.docs.test_webhooks_examples import code_blocks
from tests.schedule.test_readme import json_values

PAGE = "docs/api.md"
PASSWORD = "a long admin password"


def run(shell: str, script: str, url: str, cwd, **environment: str) -> list:
    script = script.replace("http://127.0.0.1:8000", url)
    done = subprocess.run(
        [shell, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={"PATH": os.environ["PATH"], **environment},
    )
    assert done.returncode == 0, done.stderr
    return json_values(done.stdout)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_authentication_examples_run_as_written(shell, live_server, tmp_path):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    get_user_model().objects.create_superuser("admin@example.com", PASSWORD)
    login, *after = code_blocks(section(PAGE, "## Authentication"))
    assert '"password": "..."' in login, "the login example no longer shows where the password goes"

    [tokens] = run(shell, login.replace("...", PASSWORD), live_server.url, tmp_path)
    me, refreshed = run(
        shell,
        "\n".join(after),
        live_server.url,
        tmp_path,
        ACCESS_TOKEN=tokens["access_token"],
        REFRESH_TOKEN=tokens["refresh_token"],
    )

    assert me["email"] == "admin@example.com"
    assert refreshed["refresh_token"] != tokens["refresh_token"]
    assert refreshed["access_token"]
