"""Job metrics: each transition counted once its transaction commits, never before or else.

Real commits (a transactional test database), so the ``on_commit`` callbacks run as they
do in production. Counters are process-wide: each test compares with the value before.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from prometheus_client import REGISTRY

from common.errors import Conflict
from job.models import Job
from job.monitor import Settlement, job_settle_lost
from job.services import (
    job_cancel,
    job_claim,
    job_complete,
    job_create,
    job_fail,
)
from tests.factories import AutomationFactory, UserFactory, WorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def transitions(to: str) -> float:
    return sample("hubdommed_job_transitions_total", to=to)


class Counts:
    """The job metrics now, to compare with later."""

    def __init__(self) -> None:
        self.values = self.read()

    @staticmethod
    def read() -> dict[str, float]:
        values = {
            f"to {to}": transitions(to)
            for to in ("pending", "running", "succeeded", "failed", "canceled", "retried")
        }
        values["to running timed"] = sample("hubdommed_job_time_to_running_seconds_count")
        for status in ("succeeded", "failed", "canceled"):
            values[f"{status} timed"] = sample(
                "hubdommed_job_time_to_finished_seconds_count", status=status
            )
        for code in ("already_claimed", "not_pending", "concurrency_limit"):
            values[f"refused {code}"] = sample("hubdommed_job_claim_refusals_total", code=code)
        return values

    def changes(self) -> dict[str, float]:
        now = self.read()
        return {key: now[key] - self.values[key] for key in now if now[key] != self.values[key]}


@pytest.fixture
def person():
    return UserFactory()


@pytest.fixture
def worker():
    return WorkerFactory(automation=AutomationFactory(max_concurrency=2, max_attempts=2))


def create(person, worker) -> Job:
    job, _ = job_create(
        tenant=person.tenant,
        automation_id=worker.automation_id,
        params={},
        requested_by=person,
    )
    return job


def test_a_created_job_is_counted_once_committed(person, worker):
    counts = Counts()

    create(person, worker)

    assert counts.changes() == {"to pending": 1}


def test_a_transition_rolled_back_with_its_callers_transaction_is_never_counted(person, worker):
    counts = Counts()

    with pytest.raises(Boom), transaction.atomic():
        job = create(person, worker)
        job_claim(worker=worker, job_id=job.pk)
        raise Boom

    assert counts.changes() == {}
    assert not Job.objects.exists()


def test_a_run_to_success_counts_each_step_and_times_them(person, worker):
    job = create(person, worker)
    counts = Counts()

    claimed = job_claim(worker=worker, job_id=job.pk)
    job_complete(worker=worker, job_id=job.pk, claim_token=claimed.claim_token, result={})
    # The same report again changes nothing, and counts nothing.
    job_complete(worker=worker, job_id=job.pk, claim_token=claimed.claim_token, result={})

    assert counts.changes() == {
        "to running": 1,
        "to running timed": 1,
        "to succeeded": 1,
        "succeeded timed": 1,
    }


def test_failures_and_cancellations_are_counted_by_the_status_they_end_in(person, worker):
    failing, canceled_while_running, canceled_pending = (create(person, worker) for _ in range(3))
    counts = Counts()

    token = job_claim(worker=worker, job_id=failing.pk).claim_token
    job_fail(worker=worker, job_id=failing.pk, claim_token=token, error="exit 1", exit_code=1)
    token = job_claim(worker=worker, job_id=canceled_while_running.pk).claim_token
    job_cancel(tenant=person.tenant_id, job_id=canceled_while_running.pk, actor=person)
    job_fail(worker=worker, job_id=canceled_while_running.pk, claim_token=token, error="stop")
    job_cancel(tenant=person.tenant_id, job_id=canceled_pending.pk, actor=person)

    assert counts.changes() == {
        "to running": 2,
        "to running timed": 2,
        "to failed": 1,
        "failed timed": 1,
        "to canceled": 2,
        "canceled timed": 2,
    }


def test_a_refused_claim_is_counted_by_its_code_and_not_as_a_transition(person, worker):
    job = create(person, worker)
    job_claim(worker=worker, job_id=job.pk)
    counts = Counts()

    with pytest.raises(Conflict):
        job_claim(worker=worker, job_id=job.pk)

    assert counts.changes() == {"refused already_claimed": 1}


def test_a_job_whose_worker_was_lost_and_goes_back_to_pending_is_counted_as_retried(person, worker):
    job = create(person, worker)
    job_claim(worker=worker, job_id=job.pk)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    counts = Counts()

    assert job_settle_lost(job_id=job.pk) == Settlement.REQUEUED

    assert counts.changes() == {"to retried": 1}
