"""The task run's transitions (``outbox.runs``, ``TaskRunQuerySet.fail``): each moves a run
only from the states it names, so a late or stray caller changes nothing."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from outbox import runs
from outbox.models import TaskRun

pytestmark = pytest.mark.django_db

Status = TaskRun.Status


def a_run(status: str, *, holder: str = "", lease: timedelta | None = None) -> TaskRun:
    return TaskRun.objects.create(
        run_id=uuid.uuid4(),
        task="maintenance.purge",
        queue="maintenance",
        status=status,
        receive_count=3,
        lease_holder=holder,
        lease_expires_at=timezone.now() + lease if lease is not None else None,
        finished_at=timezone.now() if status in (Status.SUCCEEDED, Status.FAILED) else None,
    )


def status_of(run: TaskRun) -> str:
    run.refresh_from_db()
    return run.status


def test_only_the_holder_of_a_running_run_moves_it_on():
    held = a_run(Status.RUNNING, holder="worker-a", lease=timedelta(minutes=1))
    run_id = str(held.run_id)

    assert runs.retry_later(run_id, "worker-b", error="late") == 0
    assert runs.give_back(run_id, "worker-b") == 0
    assert status_of(held) == Status.RUNNING

    assert runs.retry_later(run_id, "worker-a", error="boom") == 1
    held.refresh_from_db()
    assert (held.status, held.last_error, held.lease_expires_at) == (Status.RETRYING, "boom", None)
    # No longer running: the holder's own give-back after that finds nothing.
    assert runs.give_back(run_id, "worker-a") == 0


def test_a_run_given_back_is_queued_and_free():
    held = a_run(Status.RUNNING, holder="worker-a", lease=timedelta(minutes=1))

    assert runs.give_back(str(held.run_id), "worker-a") == 1

    held.refresh_from_db()
    assert (held.status, held.lease_expires_at) == (Status.QUEUED, None)


def test_a_failed_run_is_finished_with_its_error():
    run = a_run(Status.RETRYING)

    assert TaskRun.objects.filter(pk=run.pk).fail(error="InvalidInput: never") == 1

    run.refresh_from_db()
    assert (run.status, run.last_error) == (Status.FAILED, "InvalidInput: never")
    assert run.finished_at is not None and run.lease_expires_at is None


@pytest.mark.parametrize(
    ("status", "lease", "starts"),
    [
        (Status.FAILED, None, True),
        (Status.RETRYING, None, True),
        (Status.QUEUED, None, True),
        # Held under an expired lease: its holder is gone.
        (Status.RUNNING, timedelta(minutes=-1), True),
        # Held under a live lease: it would run twice.
        (Status.RUNNING, timedelta(minutes=1), False),
        # Succeeded: its message is a duplicate.
        (Status.SUCCEEDED, None, False),
    ],
)
def test_a_fresh_start_never_takes_a_run_that_succeeded_or_is_held(status, lease, starts):
    run = a_run(status, holder="worker-a" if lease is not None else "", lease=lease)

    assert runs.start_afresh([run.pk]) == int(starts)

    run.refresh_from_db()
    if starts:
        assert (run.status, run.receive_count, run.finished_at) == (Status.QUEUED, 0, None)
        assert (run.lease_holder, run.lease_expires_at) == ("", None)
    else:
        assert run.status == status and run.receive_count == 3


def test_sending_rows_again_starts_only_their_failed_runs_afresh():
    failed, retrying, expired = (
        a_run(Status.FAILED),
        a_run(Status.RETRYING),
        a_run(Status.RUNNING, holder="worker-a", lease=timedelta(minutes=-1)),
    )

    assert runs.start_afresh([failed.pk, retrying.pk, expired.pk], failed_only=True) == 1

    assert (status_of(failed), status_of(retrying), status_of(expired)) == (
        Status.QUEUED,
        Status.RETRYING,
        Status.RUNNING,
    )
    assert runs.start_afresh([]) == 0
