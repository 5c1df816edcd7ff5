"""The claim under real parallelism: threads, each with its own database connection,
claiming through the HTTP API against the real PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import connection

from job.models import Job
from outbox.models import Event
from tests.factories import AutomationFactory, JobFactory, UserFactory, WorkerFactory
from tests.job.support import worker_client

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    # Up to 50 connections at once: not beside a reliability scenario's daemons.
    pytest.mark.many_connections,
]

# PostgreSQL here allows 100 connections, shared with other test runs: at most this many
# claimers hold a connection at once in the large test (all of them are still threads).
MAX_OPEN_CONNECTIONS = 32


def post_until_answered(client, path: str, body: dict | None = None):
    """POST as a worker does: a 503 (the database out of connections: the server is shared
    with other test runs) is an answer to try again after a pause, not a claim's outcome."""
    for _ in range(50):
        response = client.post(path, body, format="json") if body else client.post(path)
        if response.status_code != 503:
            return response
        connection.close()
        time.sleep(0.2)
    return response


def run_threads(count: int, target) -> None:
    threads = [threading.Thread(target=target, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not any(thread.is_alive() for thread in threads), "a claimer hung"


class RunningMonitor(threading.Thread):
    """Samples the automation's running jobs from its own connection until stopped."""

    def __init__(self, automation_id: int) -> None:
        super().__init__(daemon=True)
        self.automation_id = automation_id
        self.stop = threading.Event()
        self.samples: list[int] = []

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                while not self.stop.is_set():
                    cursor.execute(
                        "SELECT count(*) FROM jobs WHERE automation_id = %s AND status = 'running'",
                        [self.automation_id],
                    )
                    self.samples.append(cursor.fetchone()[0])
        finally:
            connection.close()


@pytest.fixture
def running_limit_trigger():
    """A database-side check: any statement that leaves an automation with more running
    jobs than its limit fails (and the claim with it, as a 500 the test would see)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION test_jobs_running_limit() RETURNS trigger AS $$
            BEGIN
                IF NEW.status = 'running' AND (
                    SELECT count(*) FROM jobs
                    WHERE automation_id = NEW.automation_id AND status = 'running'
                ) > (SELECT max_concurrency FROM automations WHERE id = NEW.automation_id)
                THEN
                    RAISE EXCEPTION 'automation % runs more jobs than its limit',
                        NEW.automation_id;
                END IF;
                RETURN NULL;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER test_jobs_running_limit AFTER UPDATE ON jobs
                FOR EACH ROW EXECUTE FUNCTION test_jobs_running_limit();
            """
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER test_jobs_running_limit ON jobs; DROP FUNCTION test_jobs_running_limit();"
        )


def test_fifty_claimers_on_one_job_make_exactly_one_winner():
    worker = WorkerFactory(automation=AutomationFactory(max_concurrency=5))
    job = JobFactory(automation=worker.automation)
    barrier = threading.Barrier(50)
    responses: list = [None] * 50

    def claim(n: int) -> None:
        try:
            client = worker_client(worker)
            connection.ensure_connection()  # connect first, so the claims start together
            barrier.wait(timeout=60)
            responses[n] = post_until_answered(client, f"/api/v1/jobs/{job.id}/start")
        finally:
            connection.close()

    run_threads(50, claim)

    statuses = Counter(response.status_code for response in responses)
    assert statuses == {200: 1, 409: 49}
    codes = Counter(r.json()["error"]["code"] for r in responses if r.status_code == 409)
    assert codes == {"already_claimed": 49}
    winner = next(r.json() for r in responses if r.status_code == 200)
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING and job.attempt == 1
    assert str(job.claim_token) == winner["claim_token"]
    assert Event.objects.filter(type="JobStarted").count() == 1


def claim_storm(*, limit: int, jobs: int, claimers: int, complete: bool):
    """``claimers`` threads released together on ``jobs`` jobs (each job contended by
    several); winners complete their job at once when ``complete``. Returns the outcomes
    and the monitor's samples of the running count."""
    worker = WorkerFactory(automation=AutomationFactory(max_concurrency=limit))
    person = UserFactory()
    pending = JobFactory.create_batch(
        jobs, automation=worker.automation, tenant=person.tenant, requested_by=person
    )
    gate = threading.BoundedSemaphore(MAX_OPEN_CONNECTIONS)
    start = threading.Barrier(claimers)
    outcomes: list = [None] * claimers
    monitor = RunningMonitor(worker.automation_id)

    def claimer(n: int) -> None:
        job = pending[n % jobs]
        start.wait(timeout=60)
        with gate:
            try:
                client = worker_client(worker)
                response = post_until_answered(client, f"/api/v1/jobs/{job.id}/start")
                outcomes[n] = (response.status_code, response.json())
                if complete and response.status_code == 200:
                    post_until_answered(
                        client,
                        f"/api/v1/jobs/{job.id}/complete",
                        {"claim_token": response.json()["claim_token"]},
                    )
            finally:
                connection.close()

    monitor.start()
    try:
        run_threads(claimers, claimer)
    finally:
        monitor.stop.set()
        monitor.join(timeout=30)
    assert all(outcome is not None for outcome in outcomes), "a claimer failed"
    return outcomes, monitor.samples


def refusal_codes(outcomes) -> Counter:
    return Counter(body["error"]["code"] for status, body in outcomes if status == 409)


def test_two_hundred_claimers_on_a_hundred_jobs_never_exceed_the_limit(running_limit_trigger):
    outcomes, samples = claim_storm(limit=3, jobs=100, claimers=200, complete=False)

    statuses = Counter(status for status, _ in outcomes)
    assert statuses == {200: 3, 409: 197}
    assert set(refusal_codes(outcomes)) <= {"concurrency_limit", "already_claimed"}
    assert len(samples) > 10 and max(samples) <= 3
    assert Job.objects.filter(status=Job.Status.RUNNING).count() == 3
    assert Event.objects.filter(type="JobStarted").count() == 3


def test_the_limit_holds_while_jobs_keep_finishing_and_freeing_slots(running_limit_trigger):
    outcomes, samples = claim_storm(limit=3, jobs=60, claimers=120, complete=True)

    statuses = Counter(status for status, _ in outcomes)
    assert set(statuses) <= {200, 409}, statuses
    # A job's second claimer finds it running, or already finished by the first.
    assert set(refusal_codes(outcomes)) <= {"concurrency_limit", "already_claimed", "not_pending"}
    assert len(samples) > 10 and max(samples) <= 3
    wins = statuses[200]
    assert wins > 3  # slots were freed and reused
    assert Event.objects.filter(type="JobStarted").count() == wins
    assert Job.objects.filter(status=Job.Status.SUCCEEDED).count() == wins
    assert not Job.objects.filter(attempt__gt=1).exists()
