"""A job's outcome survives the hub being away: the worker keeps it on disk and reports it
when the hub answers again, even from its next start.

The hub is the live server; the worker reaches it through a port the test opens and
closes (``Forwarder``), so the outage is real: connections refused, then accepted.
"""

from __future__ import annotations

import sys
import threading
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from automation.agent.client import AutomationInfo, HubClient
from automation.agent.spool import OutcomeSpool
from automation.agent.worker import AutomationWorker
from job.models import Job
from job.services import job_claim, job_complete
from tests.factories import AutomationFactory, JobFactory, WorkerFactory
from tests.forwarding import Forwarder
from tests.polling import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def reports_put_off(caplog) -> int:
    """How many times the worker tried to report an outcome and was told to wait."""
    return sum("could not report the outcome yet" in r.getMessage() for r in caplog.records)


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


def start(worker: AutomationWorker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def test_an_outcome_the_hub_could_not_take_is_reported_once_it_answers(hub, tmp_path, caplog):
    automation = AutomationFactory(
        command=[sys.executable, "-c", "import time; time.sleep(1.5); print('finished')"]
    )
    credential = WorkerFactory(automation=automation).credential
    job = JobFactory(automation=automation)
    spool = OutcomeSpool(tmp_path / "outcomes")
    client = HubClient(hub.url, credential)
    worker = AutomationWorker(
        client, info_of(automation), poll_interval=0.2, heartbeat_interval=0.3, spool=spool
    )
    thread = start(worker)
    try:
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
    finally:
        worker.shutdown.set()
        thread.join(30)
        client.close()
    assert "finished" in Job.objects.get(pk=job.pk).output_tail


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
    client = HubClient(hub.url, worker_row.credential)
    worker = AutomationWorker(client, info_of(automation), poll_interval=60, spool=spool)
    thread = start(worker)
    try:
        wait_until(
            lambda: Job.objects.get(pk=job.pk).status == "succeeded", timeout=15, message="it"
        )
    finally:
        worker.shutdown.set()
        thread.join(30)
        client.close()
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
    client = HubClient(hub.url, worker_row.credential)
    worker = AutomationWorker(client, info_of(automation), poll_interval=60, spool=spool)
    thread = start(worker)
    try:
        wait_until(lambda: not spool.pending(), timeout=15, message="the refused outcome to go")
    finally:
        worker.shutdown.set()
        thread.join(30)
        client.close()
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
