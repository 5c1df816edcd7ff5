"""Task runs with no way forward: the monitor's ``task_runs`` check finds each shape, gives
it its way forward and proves it by the run's end, on RabbitMQ and on SQS; and it leaves
alone every run that is merely on its way.

A run is stranded when nothing has claimed its message ``MONITOR_STRANDED_RUN_SECONDS``
after its row was sent (or its lease expired, or its retry was due). The tests build each
state the way it happens (the relay sends, the broker loses or dead-letters, workers die),
then move it all that far into the past (``happened_ago``).
"""

# The worker runtime's fixtures (a relay, workers, per-test broker names) are imported from
# tests/worker/conftest.py; tests naming them as arguments "redefine" them for ruff.
# ruff: noqa: F811

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction

from common.ways_forward import stranded_checks
from outbox.models import RUN_FINISHED, RUN_WAYS_FORWARD, Event, PlatformOutboxMessage, TaskRun
from outbox.operations import outbox_send_again
from outbox.runs import RunLedger
from outbox.tasks import outbox_purge
from tests.monitor.conftest import monitor  # noqa: F401 (fixture)
from tests.observability.conftest import sample
from tests.outbox.support import deliver_until_dead_lettered, happened_ago, lose_messages
from tests.worker.conftest import (  # noqa: F401 (fixtures)
    broker,
    claim,
    dead_letters,
    dispatch_work,
    executions,
    go_ahead,
    relay,
    run_finished,
    run_of,
    start_worker,
    test_catalog,
    wait_for,
    worker_settings,
)
from worker.dead_letters import dead_letters_redrive

pytestmark = pytest.mark.django_db(transaction=True)

STRANDED = 60  # seconds: MONITOR_STRANDED_RUN_SECONDS in these tests
LONG_AGO = 2 * STRANDED


@pytest.fixture(autouse=True)
def stranded_after(settings):
    settings.MONITOR_STRANDED_RUN_SECONDS = STRANDED


def check() -> list:
    return stranded_checks()["task_runs"]()


def row_of(run_id: str) -> PlatformOutboxMessage | None:
    return PlatformOutboxMessage.objects.filter(run_id=run_id).first()


def sent(run_id: str) -> bool:
    row = row_of(run_id)
    return row is not None and row.sent_at is not None


def sent_and_lost(**payload) -> str:
    """A run whose message the relay sent and the broker then lost (its queue purged)."""
    run_id = dispatch_work(**payload)
    wait_for(lambda: sent(run_id), what="the relay to send the message")
    lose_messages()
    return run_id


def test_every_status_is_final_or_has_a_way_forward():
    assert set(RUN_FINISHED) | set(RUN_WAYS_FORWARD) == set(TaskRun.Status.values)
    assert not set(RUN_FINISHED) & set(RUN_WAYS_FORWARD)


def test_a_run_whose_message_the_broker_lost_is_sent_again_and_run_once(relay, start_worker):
    run_id = sent_and_lost()
    happened_ago(run_id, LONG_AGO)

    (repaired,) = check()

    assert repaired.repaired and repaired.row == f"task run {run_id} (test.work)"
    assert "re-armed" in repaired.action
    run = run_of(run_id)
    assert run.status == TaskRun.Status.QUEUED and run.rearmed_at is not None
    assert run.last_error.startswith("Stranded: nothing claimed its message")
    assert check() == []  # moved: not found again

    start_worker()
    wait_for(lambda: run_finished(run_id), what="the re-sent run to finish")
    assert run_of(run_id).status == TaskRun.Status.SUCCEEDED
    assert len(executions(run_id)) == 1


def test_a_run_whose_worker_died_and_whose_message_is_gone_is_sent_again(relay, start_worker):
    run_id = sent_and_lost()
    # A worker claimed it, then died; the message it held came back and was lost.
    envelope = row_of(run_id).envelope
    assert claim(RunLedger(), envelope, holder="host:1:dead", lease=30).receive_count == 1
    happened_ago(run_id, LONG_AGO)

    (repaired,) = check()

    assert repaired.repaired
    run = run_of(run_id)
    assert (run.status, run.lease_holder, run.lease_expires_at) == (
        TaskRun.Status.QUEUED,
        "",
        None,
    )
    start_worker()
    wait_for(lambda: run_finished(run_id), what="the re-sent run to finish")
    assert run_of(run_id).status == TaskRun.Status.SUCCEEDED
    assert [count for count, _ in executions(run_id)] == [2]


def test_a_retrying_run_whose_message_is_gone_is_sent_again(relay, start_worker):
    run_id = sent_and_lost()
    # Its first receive failed and the broker was to show it again after the backoff
    # (SQS's visibility): it never did.
    claim(RunLedger(), row_of(run_id).envelope, holder="host:1:gone", lease=30)
    TaskRun.objects.filter(run_id=run_id).update(
        status=TaskRun.Status.RETRYING, lease_expires_at=None, last_error="Boom (retry in 2 s)"
    )
    from outbox.stranded import _longest_backoff

    happened_ago(run_id, LONG_AGO + _longest_backoff())

    (repaired,) = check()

    assert repaired.repaired
    assert "(before: Boom (retry in 2 s))" in run_of(run_id).last_error
    start_worker()
    wait_for(lambda: run_finished(run_id), what="the re-sent run to finish")
    assert run_of(run_id).status == TaskRun.Status.SUCCEEDED


def test_a_run_the_broker_dead_lettered_after_its_receives_is_failed_and_an_operator_sends_it_back(
    relay, start_worker
):
    run_id = dispatch_work()
    wait_for(lambda: sent(run_id), what="the relay to send the message")
    # Workers that die on each delivery: each claims the run (its lease ends with it),
    # none settles it, and the broker's redrive moves the message to the dead-letter queue.
    ledger = RunLedger()
    deliveries = deliver_until_dead_lettered(
        lambda envelope: claim(ledger, envelope, holder="host:1:dying", lease=0)
    )
    # 7 deliveries (RabbitMQ's limit of 6 returns; SQS's maxReceiveCount: moto may take
    # one receive more to move it).
    assert deliveries >= 7
    assert [letter.run_id for letter in dead_letters()] == [run_id]
    assert run_of(run_id).receive_count == deliveries
    happened_ago(run_id, LONG_AGO)

    (repaired,) = check()

    assert repaired.repaired and f"after {deliveries} receives" in repaired.problem
    run = run_of(run_id)
    assert run.status == TaskRun.Status.FAILED and run.finished_at is not None
    assert run.last_error.startswith(f"Stranded: received {deliveries} times (its task allows 5)")
    assert "-dlq" in run.last_error and f"--requeue {run_id}" in run.last_error
    failed = Event.objects.get(type="TaskFailed", aggregate_id=run_id)
    assert failed.actor == "system" and failed.payload["error_type"] == "Stranded"
    assert check() == []

    # The operators' way forward: the dead letter sent back, the run starts afresh.
    assert [letter.run_id for letter in dead_letters_redrive("default", run_ids=[run_id])] == [
        run_id
    ]
    start_worker()
    wait_for(lambda: run_of(run_id).status == TaskRun.Status.SUCCEEDED, what="the run to succeed")
    assert len(executions(run_id)) == 1


def test_a_run_whose_outbox_row_is_gone_is_failed_with_the_reason(relay):
    run_id = sent_and_lost()
    outbox_purge(older_than=timedelta(0))
    assert row_of(run_id) is None
    happened_ago(run_id, LONG_AGO)

    (repaired,) = check()

    assert "outbox row is gone" in repaired.problem
    run = run_of(run_id)
    assert run.status == TaskRun.Status.FAILED and "outbox row is gone" in run.last_error


def test_a_run_sent_again_that_nobody_claims_is_left_to_an_operator_not_sent_again_and_again(
    relay,
    start_worker,
    monitor,
):
    run_id = sent_and_lost()
    happened_ago(run_id, LONG_AGO)
    assert check()[0].repaired
    wait_for(lambda: sent(run_id), what="the relay to send it again")
    # No worker consumes the queue: an hour later, still nobody has claimed it.
    happened_ago(run_id, LONG_AGO)
    sent_at = row_of(run_id).sent_at

    (left,) = check()

    assert not left.repaired and "claimed by nobody since" in left.problem
    assert "does a worker consume the default queue" in left.action
    assert row_of(run_id).sent_at == sent_at  # not re-armed again
    assert run_of(run_id).last_error.count("Stranded") == 1
    counts = monitor.run_cycle()
    assert counts.stranded.unrepaired["task_runs"] == 1

    # A worker at last: both copies reach it, the run runs once.
    start_worker()
    wait_for(lambda: run_finished(run_id), what="the run to finish")
    assert len(executions(run_id)) == 1
    assert check() == []


def test_the_monitor_counts_the_runs_it_sent_again(relay, monitor):
    run_id = sent_and_lost()
    happened_ago(run_id, LONG_AGO)
    before = sample("hubdommed_stranded_rows_total", machine="task_runs")

    counts = monitor.run_cycle()

    assert counts.stranded.repaired["task_runs"] == 1
    assert sample("hubdommed_stranded_rows_total", machine="task_runs") == before + 1
    assert run_of(run_id).rearmed_at is not None


# --- what is on its way is left alone ------------------------------------------------------


def test_a_run_held_by_a_live_worker_is_not_stranded_however_long_it_runs(relay, start_worker):
    run_id = dispatch_work(wait_for_go_ahead=True)
    start_worker()
    wait_for(lambda: run_of(run_id).status == TaskRun.Status.RUNNING, what="the run to start")
    # Claimed and sent long ago; its holder's heartbeat keeps its lease alive.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE task_runs SET updated_at = updated_at - %s * interval '1 second' "
            "WHERE run_id = %s",
            [LONG_AGO, run_id],
        )
        cursor.execute(
            "UPDATE platform_outbox_messages SET sent_at = sent_at - %s * interval '1 second' "
            "WHERE run_id = %s",
            [LONG_AGO, run_id],
        )

    assert check() == []

    go_ahead(run_id)
    wait_for(lambda: run_finished(run_id), what="the run to finish")
    assert len(executions(run_id)) == 1


def test_a_retry_the_broker_may_still_be_holding_is_not_stranded(relay):
    run_id = sent_and_lost()
    claim(RunLedger(), row_of(run_id).envelope, holder="host:1:gone", lease=30)
    TaskRun.objects.filter(run_id=run_id).update(
        status=TaskRun.Status.RETRYING, lease_expires_at=None
    )
    # Longer ago than the wait, but within the longest backoff SQS may hold it for.
    happened_ago(run_id, LONG_AGO)

    assert check() == []


def test_a_run_whose_row_waits_for_its_delay_is_not_stranded():
    with transaction.atomic():
        from outbox.services import dispatch

        run_id = str(dispatch("test.work", {}, delay=3 * 3600))
    happened_ago(run_id, 2 * 3600)  # dispatched two hours ago, due in one

    assert check() == []
    assert run_of(run_id).status == TaskRun.Status.QUEUED


def test_a_run_whose_row_is_being_sent_again_right_now_is_left_to_the_relay(relay):
    run_id = sent_and_lost()
    happened_ago(run_id, LONG_AGO)
    locked, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def send_again_holding_the_row() -> None:
        # An operator's "Send again", its transaction still open: the row is held, and the
        # check still sees it as sent long ago.
        try:
            with transaction.atomic():
                outbox_send_again(model=PlatformOutboxMessage, ids=[row_of(run_id).pk])
                locked.set()
                release.wait(10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    holder = threading.Thread(target=send_again_holding_the_row)
    holder.start()
    try:
        assert locked.wait(10)
        assert check() == []  # the row is someone else's right now
        assert run_of(run_id).rearmed_at is None
    finally:
        release.set()
        holder.join(10)
    assert not errors, errors
    # Sent again by the relay: on its way, not stranded.
    wait_for(lambda: sent(run_id), what="the relay to send it again")
    assert check() == []
    assert run_of(run_id).rearmed_at is None
