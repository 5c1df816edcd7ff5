"""The task run's transitions (``TaskRunQuerySet``): each moves a run only from the states
it names, so a late or stray caller changes nothing."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

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
    runs = TaskRun.objects

    assert runs.held_by(str(held.run_id), "worker-b").retry_later(error="late") == 0
    assert runs.held_by(str(held.run_id), "worker-b").give_back() == 0
    assert status_of(held) == Status.RUNNING

    assert runs.held_by(str(held.run_id), "worker-a").retry_later(error="boom") == 1
    held.refresh_from_db()
    assert (held.status, held.last_error, held.lease_expires_at) == (Status.RETRYING, "boom", None)
    # No longer running: the holder's own give-back after that finds nothing.
    assert runs.held_by(str(held.run_id), "worker-a").give_back() == 0


def test_a_run_given_back_is_queued_and_free():
    held = a_run(Status.RUNNING, holder="worker-a", lease=timedelta(minutes=1))

    assert TaskRun.objects.held_by(str(held.run_id), "worker-a").give_back() == 1

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

    assert TaskRun.objects.filter(pk=run.pk).start_afresh() == int(starts)

    run.refresh_from_db()
    if starts:
        assert (run.status, run.receive_count, run.finished_at) == (Status.QUEUED, 0, None)
        assert (run.lease_holder, run.lease_expires_at) == ("", None)
    else:
        assert run.status == status and run.receive_count == 3
