"""A job's outcome survives the hub being away: the worker keeps it on disk and reports it
when the hub answers again, even from its next start.

The hub is the live server; the worker reaches it through a port the test opens and
closes (``Forwarder``), so the outage is real: connections refused, then accepted.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from automation.agent import output as agent_output
from automation.agent.client import AutomationInfo, HubClient
from automation.agent.spool import OutcomeSpool
from automation.agent.worker import AutomationWorker
from job.models import Job
from job.selectors import job_output_page
from job.services import job_claim, job_complete
from tests.factories import AutomationFactory, JobFactory, WorkerFactory
from tests.forwarding import Forwarder
from tests.polling import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def reports_put_off(caplog) -> int:
    """How many times the worker tried to report an outcome (the output the hub missed
    first, then the outcome) and was told to wait."""
    return sum(
        "could not report the outcome yet" in r.getMessage()
        or "could not send the rest of the output yet" in r.getMessage()
        for r in caplog.records
    )


def info_of(automation) -> AutomationInfo:
    return AutomationInfo(
        id=automation.id,
        slug=automation.slug,
        command=list(automation.command),
        timeout_seconds=60,
        max_concurrency=1,
    )


@pytest.fixture
def hub(live_server):
    url = urlsplit(live_server.url)
    forwarder = Forwarder((url.hostname, url.port)).open()
    yield forwarder
    forwarder.close()


def stored_log(job) -> str:
    return job_output_page(job=job, offset=0, limit=1_000_000).text


def lines_on_cue(cue, *, then_wait: bool = False) -> list[str]:
    """A command that prints a line, then four more once ``cue`` exists, says so in
    ``cue``.printed, then exits (or, ``then_wait``, stays until it is stopped)."""
    program = (
        "import os, pathlib, sys, time\n"
        "print('line 0', flush=True)\n"
        "cue = pathlib.Path(sys.argv[1])\n"
        "deadline = time.monotonic() + 60\n"
        "while not cue.exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "for n in range(1, 5):\n"
        "    print(f'line {n}', flush=True)\n"
        "cue.with_suffix('.printed').touch()\n"
    )
    if then_wait:
        program += "time.sleep(60)\n"
    return [sys.executable, "-c", program, str(cue)]


def printing_job(tmp_path, *, then_wait: bool = False):
    """A job of an automation whose command is ``lines_on_cue``; its cue, the automation,
    its worker's credential, the job and the machine's spool."""
    cue = tmp_path / "go"
    automation = AutomationFactory(command=lines_on_cue(cue, then_wait=then_wait))
    credential = WorkerFactory(automation=automation).credential
    job = JobFactory(automation=automation)
    return cue, automation, credential, job, OutcomeSpool(tmp_path / "outcomes")


@contextmanager
def running(hub, automation, credential: str, spool: OutcomeSpool, **options):
    """An automation worker on its thread, reaching the hub through ``hub``."""
    client = HubClient(hub.url, credential)
    worker = AutomationWorker(client, info_of(automation), spool=spool, **options)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.shutdown.set()
        thread.join(30)
        client.close()
    assert not thread.is_alive()


def hub_away_before_the_last_lines(hub, job, cue) -> None:
    wait_until(lambda: stored_log(job) == "line 0\n", timeout=15, message="the first line")
    hub.close()
    cue.touch()
    printed = cue.with_suffix(".printed")
    wait_until(printed.exists, timeout=15, message="the last lines printed")


EVERY_LINE = "".join(f"line {n}\n" for n in range(5))
LAST_LINES = EVERY_LINE.removeprefix("line 0\n")


def kept_output(report) -> str:
    """The output kept with a report, after the chunk of the first line: that chunk is
    kept too when the hub stored it but its answer was cut by the outage (sent again, it
    stores nothing)."""
    output = report["output"]
    text = "".join(output["chunks"])
    if output["seq"] == 0:
        assert text.startswith("line 0\n"), text
        return text.removeprefix("line 0\n")
    assert output["seq"] == 1, output
    return text


def test_an_outcome_the_hub_could_not_take_is_reported_once_it_answers(hub, tmp_path, caplog):
    automation = AutomationFactory(
        command=[sys.executable, "-c", "import time; time.sleep(1.5); print('finished')"]
    )
    credential = WorkerFactory(automation=automation).credential
    job = JobFactory(automation=automation)
    spool = OutcomeSpool(tmp_path / "outcomes")
    options = {"poll_interval": 0.2, "heartbeat_interval": 0.3}
    with running(hub, automation, credential, spool, **options) as worker:
        wait_until(
            lambda: Job.objects.get(pk=job.pk).status == "running", timeout=15, message="claim"
        )
        # The claim's answer is back (the worker counted it) before the hub goes away.
        wait_until(lambda: worker.stats.claimed == 1, timeout=15, message="the claim's answer")
        hub.close()  # the hub goes away while the command runs
        wait_until(lambda: spool.pending(), timeout=15, message="the outcome on disk")
        wait_until(lambda: reports_put_off(caplog) >= 2, timeout=15, message="two reports put off")
        assert Job.objects.get(pk=job.pk).status == "running"

        hub.open()

        wait_until(
            lambda: Job.objects.get(pk=job.pk).status == "succeeded", timeout=30, message="report"
        )
        wait_until(lambda: not spool.pending(), timeout=5, message="the spool to empty")
    job = Job.objects.get(pk=job.pk)
    assert "finished" in job.output_tail
    # The line the hub missed as the command ended is in the job's log too.
    assert stored_log(job) == "finished\n"


def test_an_outcome_kept_by_a_previous_worker_is_reported_first_at_start(hub, tmp_path):
    automation = AutomationFactory()
    worker_row = WorkerFactory(automation=automation)
    job = JobFactory(automation=automation)
    claimed = job_claim(worker=worker_row, job_id=job.pk)
    # The previous worker ran the command and kept the outcome, then stopped.
    spool = OutcomeSpool(tmp_path / "outcomes")
    spool.put(
        {
            "job_id": job.pk,
            "claim_token": str(claimed.claim_token),
            "kind": "complete",
            "body": {"result": {"exit_code": 0}, "output_tail": "done before", "exit_code": 0},
        }
    )
    with running(hub, automation, worker_row.credential, spool, poll_interval=60):
        wait_until(
            lambda: Job.objects.get(pk=job.pk).status == "succeeded", timeout=15, message="it"
        )
    assert Job.objects.get(pk=job.pk).output_tail == "done before"
    assert spool.pending() == []


def test_an_outcome_the_hub_refuses_for_good_is_dropped(hub, tmp_path):
    automation = AutomationFactory()
    worker_row = WorkerFactory(automation=automation)
    job = JobFactory(automation=automation)
    claimed = job_claim(worker=worker_row, job_id=job.pk)
    job_complete(worker=worker_row, job_id=job.pk, claim_token=claimed.claim_token, result={})
    spool = OutcomeSpool(tmp_path / "outcomes")
    spool.put(
        {
            "job_id": job.pk,
            "claim_token": str(claimed.claim_token),
            "kind": "fail",
            "body": {"reason": "error", "error": "late", "output_tail": "", "exit_code": None},
        }
    )
    with running(hub, automation, worker_row.credential, spool, poll_interval=60):
        wait_until(lambda: not spool.pending(), timeout=15, message="the refused outcome to go")
    assert Job.objects.get(pk=job.pk).status == "succeeded"


def test_the_hub_takes_the_report_of_the_claim_that_ran_after_its_lease_expired():
    """Until the monitor settles the job, the claim that ran may still report."""
    automation = AutomationFactory()
    worker_row = WorkerFactory(automation=automation)
    job = JobFactory(automation=automation)
    claimed = job_claim(worker=worker_row, job_id=job.pk)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now())

    done = job_complete(
        worker=worker_row, job_id=job.pk, claim_token=claimed.claim_token, result={"ok": 1}
    )

    assert done.status == "succeeded"


def test_output_the_hub_missed_as_the_command_ended_reaches_the_log_before_the_outcome(
    hub, tmp_path, monkeypatch
):
    """The hub goes away before the command's last lines are sent: the end of the command
    waits for them a while, then they go with the report, and the hub stores them before
    the outcome that ends the job."""
    monkeypatch.setattr(agent_output, "CLOSE_SECONDS", 0.5)
    cue, automation, credential, job, spool = printing_job(tmp_path)
    options = {"poll_interval": 0.2, "heartbeat_interval": 0.3, "report_backoff_cap": 1.0}

    with running(hub, automation, credential, spool, **options):
        hub_away_before_the_last_lines(hub, job, cue)
        wait_until(spool.pending, timeout=15, message="the outcome on disk")
        assert kept_output(spool.pending()[0]) == LAST_LINES
        assert Job.objects.get(pk=job.pk).status == "running"

        hub.open()

        wait_until(
            lambda: Job.objects.get(pk=job.pk).status == "succeeded", timeout=30, message="report"
        )

    assert stored_log(Job.objects.get(pk=job.pk)) == EVERY_LINE
    assert spool.pending() == []


def test_output_a_stopped_worker_could_not_send_is_sent_by_the_next_one_before_the_outcome(
    hub, tmp_path
):
    """The worker is stopped with the hub away: its command is stopped, the output the hub
    missed waits on disk with the outcome, and the next worker on the machine sends both."""
    cue, automation, credential, job, spool = printing_job(tmp_path, then_wait=True)
    options = {"poll_interval": 0.2, "heartbeat_interval": 0.3, "stop_budget": 0.2}

    with running(hub, automation, credential, spool, **options):
        hub_away_before_the_last_lines(hub, job, cue)
    # Stopped: the command was stopped, and its outcome could not be reported.
    kept = spool.pending()
    assert len(kept) == 1 and kept[0]["kind"] == "fail"
    assert kept_output(kept[0]) == LAST_LINES

    hub.open()
    with running(hub, automation, credential, spool, poll_interval=60):
        wait_until(lambda: not spool.pending(), timeout=15, message="the kept outcome to go")

    job = Job.objects.get(pk=job.pk)
    assert job.status != "running"
    assert stored_log(job) == EVERY_LINE
