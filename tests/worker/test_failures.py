"""Transient failures come back after growing delays; permanent ones are parked at once."""

from __future__ import annotations

import itertools

import pytest

from outbox.models import Event, TaskRun
from tests.worker.conftest import (
    RETRY,
    dead_letters,
    dispatch_work,
    executions,
    run_finished,
    run_of,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


def lower_bound_of_delay(broker: str, receive_count: int) -> float:
    """The least time before the next receive: half the exponential step (equal jitter);
    SQS counts visibility in whole seconds, rounded up."""
    step = min(RETRY["backoff_max_seconds"], RETRY["backoff_seconds"] * 2 ** (receive_count - 1))
    return 1.0 if broker == "sqs" else step / 2


def test_a_transient_failure_is_retried_with_growing_delays_and_succeeds(
    broker, relay, start_worker
):
    start_worker()
    run_id = dispatch_work(succeed_on=3)

    wait_for(lambda: run_finished(run_id), what="the run to finish")

    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert run.receive_count == 3
    assert "TransientProblem" in run.last_error
    runs = executions(run_id)
    assert [count for count, _ in runs] == [1, 2, 3]
    gaps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(runs)]
    bounds = [lower_bound_of_delay(broker, count) for count, _ in runs[:-1]]
    assert all(gap >= bound for gap, bound in zip(gaps, bounds, strict=True)), (gaps, bounds)
    if broker == "rabbitmq":
        assert bounds[1] > bounds[0]


def test_a_task_failing_transiently_five_times_lands_in_the_dead_letter_queue_with_its_error(
    broker, relay, start_worker
):
    start_worker()
    run_id = dispatch_work(succeed_on=99)

    wait_for(lambda: run_finished(run_id), timeout=60, what="the run to fail")

    run = run_of(run_id)
    assert run.status == TaskRun.Status.FAILED
    assert run.receive_count == 5
    assert run.finished_at is not None
    assert len(executions(run_id)) == 5
    (letter,) = wait_for(lambda: dead_letters("default"), what="the dead letter")
    assert letter.run_id == run_id
    assert letter.error["x-error-type"] == "tests.worker.tasks.TransientProblem"
    assert letter.error["x-error-message"] == "not yet (receive 5)"
    assert letter.error["x-error-receive-count"] == "5"
    assert "raise TransientProblem" in letter.error["x-error-traceback"]
    event = Event.objects.get(type="TaskFailed", aggregate_type="TaskRun", aggregate_id=run_id)
    assert event.payload["receive_count"] == 5
    assert event.payload["task"] == "test.work"


def test_a_permanent_failure_lands_in_the_dead_letter_queue_on_the_first_receive(
    broker, relay, start_worker
):
    start_worker()
    run_id = dispatch_work(permanent=True)

    wait_for(lambda: run_finished(run_id), what="the run to fail")

    run = run_of(run_id)
    assert run.status == TaskRun.Status.FAILED
    assert run.receive_count == 1
    assert "InvalidInput" in run.last_error
    assert len(executions(run_id)) == 1
    (letter,) = wait_for(lambda: dead_letters("default"), what="the dead letter")
    assert letter.run_id == run_id
    assert letter.error["x-error-type"] == "common.errors.InvalidInput"
    assert letter.error["x-error-receive-count"] == "1"
    assert Event.objects.filter(type="TaskFailed", aggregate_id=run_id).count() == 1


def test_a_message_for_a_task_without_a_handler_is_parked_not_retried(
    broker, relay, start_worker, settings, tmp_path
):
    import json

    catalog = json.loads(settings.TASKS_CATALOG.read_text())
    catalog["tasks"].append({"name": "test.unhandled", "queue": "default"})
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(catalog))
    settings.TASKS_CATALOG = path
    start_worker()
    from django.db import transaction

    from outbox.services import dispatch

    with transaction.atomic():
        run_id = str(dispatch("test.unhandled", {}))

    wait_for(lambda: run_finished(run_id), what="the run to fail")

    assert run_of(run_id).receive_count == 1
    (letter,) = wait_for(lambda: dead_letters("default"), what="the dead letter")
    assert letter.error["x-error-type"] == "outbox.task_errors.UnknownTaskHandler"
