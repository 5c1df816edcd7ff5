"""A worker's reports racing each other and the monitor, under real parallelism: threads,
each with its own database connection, against the real PostgreSQL.

Whatever the interleaving, a job ends once, records one event for it, and every loser
gets a refusal in the error format (never a 500)."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from itertools import pairwise

import pytest
from django.db import connection
from django.utils import timezone

from job.models import Job, JobOutputChunk
from job.monitor import Settlement, job_settle_lost
from tests.factories import AutomationFactory, JobFactory, WorkerFactory
from tests.job.support import events_of, worker_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

# Threads released together on one job: enough to interleave, few enough for a shared server.
RACERS = 8


def race(targets) -> list:
    """Run each of ``targets`` in its own thread, released together; their results."""
    barrier = threading.Barrier(len(targets))
    results: list = [None] * len(targets)

    def run(n: int) -> None:
        try:
            connection.ensure_connection()  # connect first, so the calls start together
            barrier.wait(timeout=60)
            results[n] = targets[n]()
        except Exception as exc:  # reported by the assertion below
            results[n] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not any(thread.is_alive() for thread in threads), "a racer hung"
    assert not any(isinstance(result, Exception) for result in results), results
    return results


@pytest.fixture
def claimed():
    """A job its worker claimed through the API: (worker, job, claim_token)."""
    worker = WorkerFactory(automation=AutomationFactory(max_concurrency=5))
    job = JobFactory(automation=worker.automation)
    response = worker_client(worker).post(f"/api/v1/jobs/{job.id}/start")
    assert response.status_code == 200, response.content
    return worker, job, response.json()["claim_token"]


def report(worker, job, action: str, body: dict):
    def call():
        response = worker_client(worker).post(
            f"/api/v1/jobs/{job.id}/{action}", body, format="json"
        )
        return response.status_code, response.json()

    return call


def error_codes(results) -> Counter:
    return Counter(body["error"]["code"] for status, body in results if status != 200)


def test_success_and_failure_reported_at_once_end_the_job_once(claimed):
    worker, job, token = claimed
    complete = report(worker, job, "complete", {"claim_token": token, "result": {"ok": 1}})
    fail = report(worker, job, "fail", {"claim_token": token, "error": "boom"})

    results = race([complete, fail] * (RACERS // 2))

    job.refresh_from_db()
    assert job.status in (Job.Status.SUCCEEDED, Job.Status.FAILED)
    won = "complete" if job.status == Job.Status.SUCCEEDED else "fail"
    statuses = Counter(status for status, _ in results)
    # The winner's repeats are answered as the same report; the other kind is refused.
    assert statuses == {200: RACERS // 2, 409: RACERS // 2}, results
    assert error_codes(results) == {"already_finished": RACERS // 2}
    assert events_of(job.id) == ["JobStarted", "JobCompleted" if won == "complete" else "JobFailed"]


def test_the_same_report_sent_many_times_at_once_is_recorded_once(claimed):
    worker, job, token = claimed
    body = {"claim_token": token, "result": {"rows": 3}, "exit_code": 0, "output_tail": "done"}

    results = race([report(worker, job, "complete", body)] * RACERS)

    assert [status for status, _ in results] == [200] * RACERS, results
    assert {body["status"] for _, body in results} == {"succeeded"}
    assert events_of(job.id) == ["JobStarted", "JobCompleted"]


def test_a_report_racing_the_monitor_on_an_expired_lease_ends_the_job_once(claimed):
    worker, job, token = claimed
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    complete = report(worker, job, "complete", {"claim_token": token})
    heartbeat = report(worker, job, "heartbeat", {"claim_token": token})

    results = race([complete, heartbeat, lambda: job_settle_lost(job_id=job.id)] * 2)

    job.refresh_from_db()
    answers = [result for result in results if isinstance(result, tuple)]
    settlements = [result for result in results if isinstance(result, Settlement)]
    assert all(status in (200, 409) for status, _ in answers), answers
    assert job.status in (Job.Status.SUCCEEDED, Job.Status.FAILED)
    if job.status == Job.Status.SUCCEEDED:
        # The worker got there first: the monitor found it alive, finished or held.
        assert Settlement.FAILED not in settlements
        assert events_of(job.id) == ["JobStarted", "JobCompleted"]
    else:
        assert settlements.count(Settlement.FAILED) == 1
        assert set(error_codes(answers)) <= {"already_finished"}
        assert events_of(job.id) == ["JobStarted", "JobFailed"]


def test_chunks_sent_at_once_are_stored_once_each_end_to_end(claimed):
    worker, job, token = claimed
    sends = [
        report(worker, job, "output", {"claim_token": token, "seq": seq, "text": f"<{seq}>"})
        for seq in (0, 0, 1, 1, 2, 2, 3, 3)
    ]

    results = race(sends)

    assert all(status in (200, 409) for status, _ in results), results
    assert set(error_codes(results)) <= {"output_out_of_order"}
    chunks = list(JobOutputChunk.objects.filter(job=job).order_by("offset"))
    # However the sends interleaved, what is stored is 0, 1, 2... once each, end to end.
    assert [chunk.seq for chunk in chunks] == list(range(len(chunks)))
    assert len(chunks) >= 1
    for before, after in pairwise(chunks):
        assert after.offset == before.end
