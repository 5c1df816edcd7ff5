"""The "Writing a schedule" examples of docs/schedules.md, after the README's walkthrough, work
as written against the real API, in bash and zsh."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from django.core.management import call_command

from schedule.models import Schedule
from tests.docs.test_readme import shell_script, walkthrough


def schedules_section() -> str:
    return shell_script("docs/schedules.md", "## Writing a schedule")


def json_values(text: str) -> list:
    """The JSON values printed one after another (curl prints no newline after a body)."""
    decoder, values, position = json.JSONDecoder(), [], 0
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        value, position = decoder.raw_decode(text, position)
        values.append(value)
    return values


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_schedules_examples_run_as_written(shell, live_server, settings, tmp_path):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    login = tmp_path / "demo-login.txt"
    settings.DEMO_LOGIN_FILE = str(login)
    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    script = (walkthrough() + "\n" + schedules_section()).replace("var/demo-login.txt", str(login))
    script = script.replace("http://127.0.0.1:8000", live_server.url)

    done = subprocess.run(
        [shell, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )

    assert done.returncode == 0, done.stderr
    *_, listed, paused = json_values(done.stdout)
    schedule = Schedule.objects.get()
    assert [s["id"] for s in listed["results"]] == [schedule.pk]
    assert listed["results"][0]["next_run_at"] is not None
    assert paused["id"] == schedule.pk and paused["status"] == "paused"
    assert schedule.cron == "0 6 * * 1-5" and schedule.timezone == "America/Sao_Paulo"
    assert schedule.params == {"name": "Ada"}
