"""The examples of docs/api.md work as written against the real API, in bash and zsh: a
platform admin logs in, reads /me with the access token, and refreshes; a person runs a
finished job again; a manager reads the events trail."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from django.contrib.auth import get_user_model

from job.models import JobOutputChunk
from tests.clients import client_of
from tests.docs.test_readme import section
from tests.docs.test_webhooks_examples import code_blocks
from tests.factories import (
    AutomationFactory,
    JobFactory,
    ManagerFactory,
    RunningJobFactory,
    UserFactory,
    bearer,
)
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


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_rerun_example_runs_as_written_and_its_repeat_returns_the_same_job(
    shell, live_server, tmp_path
):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    person = UserFactory()
    job = JobFactory(tenant=person.tenant, status="succeeded", params={"name": "Ada"})
    [example] = code_blocks(section(PAGE, "## Jobs"))
    environment = {"TOKEN": bearer(person).removeprefix("Bearer "), "JOB": str(job.pk)}

    [rerun] = run(shell, example, live_server.url, tmp_path, **environment)
    [again] = run(shell, example, live_server.url, tmp_path, **environment)

    assert rerun["rerun_of"] == job.pk and rerun["params"] == {"name": "Ada"}
    assert again == rerun


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_events_example_runs_as_written_and_answers_as_shown(shell, live_server, tmp_path):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    manager = ManagerFactory()
    member = UserFactory(tenant=manager.tenant)
    automation = AutomationFactory()
    client_of(member).post("/api/v1/jobs", {"automation": automation.id}, format="json")
    example, answer = code_blocks(section(PAGE, "## The events trail"))
    environment = {"TOKEN": bearer(manager).removeprefix("Bearer ")}

    [listed] = run(shell, example, live_server.url, tmp_path, **environment)

    [shown] = json_values(answer)
    (event,) = listed["results"]
    assert event["type"] == "JobCreated" and event["actor"] == f"user:{member.id}"
    assert set(listed) == set(shown)
    assert set(event) == set(shown["results"][0])
    assert set(event["aggregate"]) == set(shown["results"][0]["aggregate"])
    # (A payload may grow a key; what the page shows must still be there.)
    assert set(shown["results"][0]["payload"]) <= set(event["payload"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_output_example_prints_the_jobs_log_as_text(shell, live_server, tmp_path):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    person = UserFactory()
    job = RunningJobFactory(tenant=person.tenant)
    for seq, (offset, text) in enumerate([(0, "tick 0\n"), (7, "tick 1\n")]):
        JobOutputChunk.objects.create(job=job, attempt=1, seq=seq, offset=offset, text=text)
    blocks = code_blocks(section(PAGE, "## A job's output"))
    example = next(block for block in blocks if block.startswith("curl"))
    environment = {"TOKEN": bearer(person).removeprefix("Bearer "), "JOB": str(job.pk)}

    done = subprocess.run(
        [shell, "-c", example.replace("http://127.0.0.1:8000", live_server.url)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], **environment},
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout == "tick 0\ntick 1\n"
