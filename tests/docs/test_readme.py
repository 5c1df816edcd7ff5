"""The shell examples of the README and of docs/ work as written, in bash and in zsh.

The README keeps the walkthrough; the reference material (the API, schedules, webhooks,
operations) lives in docs/. Every page is read here, so an example that moves from one page
to another is still checked, and a section the tests run must be found where it is said to be.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]
#: Every page whose examples people copy: the README first, then docs/.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_lines(text: str) -> list[str]:
    """The lines of the indented code blocks."""
    return [line for line in text.splitlines() if line.startswith("    ")]


def section(page: str, heading: str) -> str:
    """The text of one ``## `` section of a page (``page`` relative to the repository)."""
    text = (ROOT / page).read_text()
    assert f"\n{heading}" in text, f"{page} has no section {heading!r}"
    return text.split(f"\n{heading}", 1)[1].split("\n## ", 1)[0]


def shell_script(page: str, heading: str) -> str:
    """The indented code of one section, as a script."""
    return "\n".join(line[4:] for line in code_lines(section(page, heading)))


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_url_in_a_shell_example_is_quoted(page):
    # zsh takes an unquoted ? or * for a pattern and stops with "no matches found".
    unquoted = [
        line.strip()
        for line in code_lines(page.read_text())
        for match in re.finditer(r"https?://", line)
        if line[match.start() - 1] not in "\"'"
    ]
    assert unquoted == []


def walkthrough() -> str:
    return shell_script("README.md", "## Try it")


@pytest.fixture
def demo_shell(request, live_server, settings, tmp_path):
    """Runs a README script in the shell the test is for, as its reader would: against
    the demo's data, the live server for ``make run``'s address, in a folder of its own;
    its standard output."""
    shell = request.param
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    login = tmp_path / "demo-login.txt"
    settings.DEMO_LOGIN_FILE = str(login)
    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115

    def run(script: str) -> str:
        script = script.replace("var/demo-login.txt", str(login))
        script = script.replace("http://127.0.0.1:8000", live_server.url)
        done = subprocess.run(
            [shell, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    return run


SHELLS = pytest.mark.parametrize("demo_shell", ["bash", "zsh"], indirect=True)


@pytest.mark.django_db(transaction=True)
@SHELLS
def test_the_walkthrough_runs_as_written(demo_shell):
    job = json.loads(demo_shell(walkthrough()))

    assert job["status"] == "pending" and job["params"] == {"name": "Ada"}


def again() -> str:
    return shell_script("README.md", "## Again, and who did what")


def json_documents(text: str) -> list:
    """The JSON documents printed one after another (curl adds no newline)."""
    decoder, documents, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        document, at = decoder.raw_decode(text, at)
        documents.append(document)
    return documents


@pytest.mark.django_db(transaction=True)
@SHELLS
def test_the_walkthrough_s_rerun_and_trail_run_as_written(demo_shell, tmp_path):
    from job.models import Job
    from job.services import job_claim, job_complete

    demo_shell(walkthrough() + '\necho "$JOB" > job.txt; echo "$TOKEN" > token.txt\n')
    first = Job.objects.get(pk=int((tmp_path / "job.txt").read_text()))
    # The automation's worker, as make run would have it: the job claimed and reported.
    claimed = job_claim(worker=first.automation.worker, job_id=first.pk)
    job_complete(
        worker=first.automation.worker,
        job_id=first.pk,
        claim_token=claimed.claim_token,
        result={},
        output_tail="hello, Ada!\n",
        exit_code=0,
    )

    rerun, trail = json_documents(
        demo_shell("JOB=$(cat job.txt); TOKEN=$(cat token.txt)\n" + again())
    )

    assert rerun["rerun_of"] == first.pk and rerun["id"] != first.pk
    assert rerun["status"] == "pending" and rerun["params"] == {"name": "Ada"}
    assert [event["type"] for event in trail["results"]] == [
        "JobCompleted",
        "JobStarted",
        "JobCreated",
    ]
    assert {event["aggregate"]["id"] for event in trail["results"]} == {str(first.pk)}
    worker = f"worker:{first.automation.worker.pk}"
    assert [event["actor"] for event in trail["results"]] == [
        worker,
        worker,
        f"user:{first.requested_by_id}",
    ]
    assert trail["results"][-1]["correlation_id"]  # the POST's request id
