"""One run of webhook.deliver takes many deliveries of its endpoint: those recorded while
its run is due join it, and it sends them one after another on the kept connection,
oldest first, while the receiver answers fast. A run that stops short (a slow or failing
receiver, its endpoint disabled, its share or its time spent) hands the rest on before it
returns; an event that joins a run while its worker is at it is never left behind."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from outbox.models import OutboxMessage
from tests.polling import wait_until
from tests.webhook.conftest import Reply, due_deliver_runs, run_attempt, run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook import delivery as engine
from webhook import recording
from webhook.delivery import Outcome, deliveries_run
from webhook.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def deliveries(endpoint) -> list[WebhookDelivery]:
    return list(WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id"))


@contextlib.contextmanager
def an_event_held_open(tenant) -> Iterator[threading.Event]:
    """A JobCompleted of ``tenant`` whose transaction stays open (its delivery joins the
    endpoint's run, holding the run's newest delivery FOR SHARE) until the block sets the
    event it is given; on leaving, its commit is waited for and its failure reported."""
    joined, commit = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold():
        try:
            with transaction.atomic():
                complete_a_job(tenant)
                joined.set()
                commit.wait(10)
        except BaseException as exc:  # reported below
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert joined.wait(10), failures
    try:
        yield commit
    finally:
        commit.set()
        thread.join(10)
    assert not failures


def a_fast_endpoint(make_endpoint, tenant, receiver) -> WebhookEndpoint:
    """An endpoint whose first delivery was answered fast (so it takes runs at full pace)."""
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    run_due_attempts()
    receiver.received.clear()
    return endpoint


def run_of(row: OutboxMessage) -> uuid.UUID:
    return uuid.UUID(row.envelope["run_id"])


def sent(row: OutboxMessage) -> OutboxMessage:
    """The row marked sent, as the relay does before a worker takes its run."""
    OutboxMessage.objects.filter(pk=row.pk).update(sent_at=timezone.now())
    return row


def a_session_waits_for_a_row_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple')"
        )
        return cursor.fetchone()[0] > 0


def test_events_recorded_together_share_one_run_sent_oldest_first_on_one_connection(
    receiver, make_endpoint, tenant
):
    endpoint = make_endpoint(receiver.url)
    with transaction.atomic():
        for _ in range(5):
            complete_a_job(tenant)

    (row,) = map(sent, due_deliver_runs())
    assert {d.scheduled_run_id for d in deliveries(endpoint)} == {run_of(row)}
    assert row.envelope["payload"]["delivery_id"] == deliveries(endpoint)[0].pk

    assert run_attempt(row) == ["delivered"] * 5
    requests = receiver.requests()
    assert [r.headers["webhook-id"] for r in requests] == [
        d.message_id for d in deliveries(endpoint)
    ]
    assert len({r.client_port for r in requests}) == 1
    assert {d.status for d in deliveries(endpoint)} == {"delivered"}
    assert WebhookAttempt.objects.filter(delivery__endpoint=endpoint).count() == 5


def test_an_event_joins_its_endpoints_run_due_now_while_it_has_room(
    receiver, make_endpoint, tenant, monkeypatch
):
    # The room a run has for an event's delivery to join it.
    monkeypatch.setattr(recording, "DELIVERIES_PER_RUN", 3)
    endpoint = make_endpoint(receiver.url)
    for _ in range(4):
        complete_a_job(tenant)  # each in its own transaction

    first, second = due_deliver_runs()
    runs = [d.scheduled_run_id for d in deliveries(endpoint)]
    assert runs == [run_of(first)] * 3 + [run_of(second)]
    assert run_due_attempts() == 4


def test_an_event_takes_a_run_of_its_own_beside_a_run_already_begun_or_due_later(
    receiver, make_endpoint, tenant
):
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    (begun,) = deliveries(endpoint)
    # Its run's worker began it (a worker in the middle of the run, or dead there).
    WebhookDelivery.objects.filter(pk=begun.pk).update(attempt_started_at=begun.created_at)
    complete_a_job(tenant)
    later = deliveries(endpoint)[1]
    assert later.scheduled_run_id != begun.scheduled_run_id

    # A retry due later is no run to join either: the event would wait for it.
    receiver.script(Reply(status=503))
    other = make_endpoint(receiver.url)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(status="disabled")
    complete_a_job(tenant)
    run_due_attempts()
    retry = WebhookDelivery.objects.get(endpoint=other)
    assert retry.status == "pending" and retry.scheduled_run_id is not None
    WebhookEndpoint.objects.filter(pk=other.pk).update(failing_since=None)
    complete_a_job(tenant)
    new = WebhookDelivery.objects.filter(endpoint=other).order_by("id").last()
    assert new.scheduled_run_id not in (None, retry.scheduled_run_id)


def test_a_run_of_a_fast_receiver_costs_two_statements_a_batch(receiver, make_endpoint, tenant):
    endpoint = a_fast_endpoint(make_endpoint, tenant, receiver)
    with transaction.atomic():
        for _ in range(10):
            complete_a_job(tenant)
    (row,) = map(sent, due_deliver_runs())

    with CaptureQueriesContext(connection) as captured:
        outcomes = deliveries_run(
            delivery_id=row.envelope["payload"]["delivery_id"], run_id=run_of(row)
        )

    assert outcomes == [Outcome.DELIVERED] * 10
    # The first begun in one statement and recorded in one (with the run's next delivery);
    # the nine after it begun together in one, and recorded together in one, whose commit
    # (the run's last) waits for the disk and makes the first one durable with it.
    statements = [query["sql"] for query in captured.captured_queries]
    assert len(statements) == 4, statements
    assert statements[-1].lstrip().startswith("WITH endpoint AS")
    assert WebhookDelivery.objects.filter(endpoint=endpoint, status="delivered").count() == 11


def test_a_run_past_its_deadline_hands_the_rest_to_a_new_run_due_now(
    receiver, make_endpoint, tenant
):
    endpoint = a_fast_endpoint(make_endpoint, tenant, receiver)
    with transaction.atomic():
        for _ in range(3):
            complete_a_job(tenant)
    (row,) = map(sent, due_deliver_runs())
    first = deliveries(endpoint)[1]

    # Its deadline has passed already: it makes its first attempt, and begins no more.
    outcomes = deliveries_run(delivery_id=first.pk, run_id=run_of(row), deadline=0.0)

    assert outcomes == [Outcome.DELIVERED]
    rest = deliveries(endpoint)[2:]
    assert [d.status for d in rest] == ["pending", "pending"]
    (handed,) = [r for r in due_deliver_runs() if r.pk != row.pk]
    assert {d.scheduled_run_id for d in rest} == {run_of(handed)}
    assert handed.envelope["payload"]["delivery_id"] == rest[0].pk
    now = timezone.now()
    assert handed.available_at <= now and all(d.next_attempt_at <= now for d in rest)
    OutboxMessage.objects.filter(pk=row.pk).update(sent_at=row.created_at)
    assert run_due_attempts() == 2


def test_the_run_deadline_leaves_an_attempts_budget_and_a_margin_before_the_time_limit(
    settings,
):
    from outbox.catalog import get_catalog

    limit = get_catalog().task("webhook.deliver").time_limit_seconds
    budget = settings.WEBHOOK_TIMEOUT + 5
    assert engine.run_deadline(100.0) == 100.0 + limit - budget - engine.RUN_MARGIN_SECONDS
    assert engine.run_deadline(100.0) > 100.0


def test_a_failing_receiver_cuts_the_run_short_and_parks_the_rest_behind_its_probe(
    receiver, make_endpoint, tenant
):
    endpoint = a_fast_endpoint(make_endpoint, tenant, receiver)
    with transaction.atomic():
        for _ in range(4):
            complete_a_job(tenant)
    receiver.script(Reply(status=200), Reply(status=503))
    (row,) = map(sent, due_deliver_runs())

    assert run_attempt(row) == ["delivered", "retrying"]

    _, delivered, retrying, *rest = deliveries(endpoint)
    assert delivered.status == "delivered"
    (probe,) = due_deliver_runs()
    assert retrying.scheduled_run_id == run_of(probe)  # the probe: its own retry
    assert all(d.is_parked for d in rest)
    assert len(receiver.requests()) == 2
    run_due_attempts()  # the probe succeeds, and takes the parked ones up
    run_due_attempts()
    assert {d.status for d in deliveries(endpoint)} == {"delivered"}


def test_a_final_failure_of_a_failing_endpoints_probe_hands_the_probe_to_the_runs_rest(
    receiver, make_endpoint, tenant
):
    endpoint = a_fast_endpoint(make_endpoint, tenant, receiver)
    with transaction.atomic():
        for _ in range(3):
            complete_a_job(tenant)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(failing_since=endpoint.created_at)
    receiver.script(Reply(status=410))
    (row,) = map(sent, due_deliver_runs())

    assert run_attempt(row) == ["failed"]

    _, failed, *rest = deliveries(endpoint)
    assert failed.status == "failed"
    # The run's rest is parked, the oldest of them scheduled as the endpoint's probe.
    probe, parked = rest
    (probe_run,) = due_deliver_runs()
    assert probe.scheduled_run_id == run_of(probe_run) and parked.is_parked


def test_a_slow_receiver_cuts_the_run_short_and_the_rest_take_one_attempt_at_a_time(
    receiver, make_endpoint, tenant, settings
):
    settings.WEBHOOK_SLOW_SECONDS = 0.1
    endpoint = a_fast_endpoint(make_endpoint, tenant, receiver)
    with transaction.atomic():
        for _ in range(3):
            complete_a_job(tenant)
    receiver.script(Reply(delay=0.2))  # delivered, but slower than the mark
    (row,) = map(sent, due_deliver_runs())

    assert run_attempt(row) == ["delivered"]

    assert not WebhookEndpoint.objects.get(pk=endpoint.pk).answers_fast
    rest = deliveries(endpoint)[2:]
    (handed,) = due_deliver_runs()
    assert {d.scheduled_run_id for d in rest} == {run_of(handed)}
    # The receiver answers fast again: the next run goes on through the rest.
    assert run_attempt(handed) == ["delivered", "delivered"]


def test_an_endpoint_disabled_before_its_run_holds_the_whole_run(
    receiver, make_endpoint, tenant, manager
):
    from webhook.services import endpoint_disable

    endpoint = a_fast_endpoint(make_endpoint, tenant, receiver)
    with transaction.atomic():
        for _ in range(3):
            complete_a_job(tenant)
    endpoint_disable(tenant=tenant, endpoint_id=endpoint.pk, actor=manager)
    (row,) = map(sent, due_deliver_runs())

    assert run_attempt(row) == ["held"]

    assert all(d.is_parked for d in deliveries(endpoint)[1:])
    assert receiver.requests() == []


def test_a_run_behind_a_live_attempt_of_a_new_receiver_parks_whole(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)  # new: one attempt at a time
    complete_a_job(tenant)
    first = deliveries(endpoint)[0]
    # The first one's attempt is in flight on a live session (this test's).
    WebhookDelivery.objects.filter(pk=first.pk).update(attempt_started_at=first.created_at)
    engine._hold_attempt(first.pk)
    try:
        with transaction.atomic():
            for _ in range(3):
                complete_a_job(tenant)
        rows = OutboxMessage.objects.count()
        (row,) = [sent(r) for r in due_deliver_runs() if run_of(r) != first.scheduled_run_id]
        assert run_attempt(row) == ["deferred"]
    finally:
        engine._let_go_attempt(first.pk)

    assert all(d.is_parked for d in deliveries(endpoint)[1:])
    assert OutboxMessage.objects.count() == rows  # no new run
    # The attempt in flight ends delivered, and takes them up, as one run.
    assert engine.delivery_attempt(delivery_id=first.pk, run_id=first.scheduled_run_id) == (
        Outcome.DELIVERED
    )
    (taken,) = [r for r in due_deliver_runs() if run_of(r) != first.scheduled_run_id]
    assert run_attempt(taken) == ["delivered"] * 3


def test_a_run_whose_deliveries_were_taken_from_it_does_nothing(receiver, make_endpoint, tenant):
    make_endpoint(receiver.url)
    with transaction.atomic():
        complete_a_job(tenant)
        complete_a_job(tenant)
    (row,) = map(sent, due_deliver_runs())
    run_attempt(row)
    # The broker delivered the message again: every delivery of it is done.
    assert run_attempt(row) == ["stale"]
    assert len(receiver.requests()) == 2


@pytest.mark.django_db(transaction=True)
def test_an_event_joining_a_run_its_worker_is_at_is_taken_by_that_run(
    receiver, make_endpoint, tenant
):
    endpoint = a_fast_endpoint(make_endpoint, tenant, receiver)
    with transaction.atomic():
        for _ in range(3):
            complete_a_job(tenant)
    (row,) = map(sent, due_deliver_runs())
    outcomes: list[Outcome] = []
    with an_event_held_open(tenant) as commit:
        run = threading.Thread(
            target=lambda: (
                outcomes.extend(
                    deliveries_run(
                        delivery_id=row.envelope["payload"]["delivery_id"], run_id=run_of(row)
                    )
                ),
                connection.close(),
            )
        )
        run.start()
        # The run makes its first attempt, and the beginning of the batch with the delivery
        # the event holds waits there for its commit.
        wait_until(lambda: receiver.requests(), timeout=10, message="the first delivery")
        wait_until(a_session_waits_for_a_row_lock, timeout=10, message="the run to wait")
        assert len(receiver.requests()) == 1
        commit.set()
    run.join(10)

    assert outcomes == [Outcome.DELIVERED] * 4
    assert {d.status for d in deliveries(endpoint)} == {"delivered"}
    assert due_deliver_runs() == []


@pytest.mark.django_db(transaction=True)
def test_a_run_that_stops_short_waits_for_an_event_joining_it_and_hands_it_on_too(
    receiver, make_endpoint, tenant
):
    endpoint = a_fast_endpoint(make_endpoint, tenant, receiver)
    with transaction.atomic():
        for _ in range(3):
            complete_a_job(tenant)
    (row,) = map(sent, due_deliver_runs())
    handed = threading.Event()

    def the_run_stops_after_one():
        try:
            deliveries_run(
                delivery_id=row.envelope["payload"]["delivery_id"], run_id=run_of(row), most=1
            )
            handed.set()
        finally:
            connection.close()

    with an_event_held_open(tenant) as commit:
        run = threading.Thread(target=the_run_stops_after_one)
        run.start()
        wait_until(lambda: len(receiver.requests()) == 1, timeout=10, message="the first delivery")
        # The hand-on waits for the event that is joining the run.
        wait_until(a_session_waits_for_a_row_lock, timeout=10, message="the hand-on to wait")
        assert not handed.is_set()
        commit.set()
    run.join(10)
    assert handed.is_set()

    rest = deliveries(endpoint)[2:]
    assert len(rest) == 3 and {d.status for d in rest} == {"pending"}
    assert len({d.scheduled_run_id for d in rest}) == 1
    assert rest[0].scheduled_run_id != run_of(row)
    assert run_due_attempts() == 3


def test_a_batch_sends_for_half_the_slow_mark_then_the_run_begins_the_next(
    receiver, make_endpoint, tenant, settings, monkeypatch
):
    # Each delivery of a batch counts as in flight from the batch's beginning: a batch that
    # went on past the slow mark would look like a slow attempt to the endpoint's other runs.
    settings.WEBHOOK_SLOW_SECONDS = 1.0
    endpoint = a_fast_endpoint(make_endpoint, tenant, receiver)
    with transaction.atomic():
        for _ in range(6):
            complete_a_job(tenant)
    (row,) = map(sent, due_deliver_runs())
    clock = iter(step * 0.3 for step in range(1000))  # 0.3 s a reading
    monkeypatch.setattr(engine, "monotonic", lambda: next(clock))

    with CaptureQueriesContext(connection) as captured:
        outcomes = deliveries_run(
            delivery_id=row.envelope["payload"]["delivery_id"], run_id=run_of(row)
        )

    assert outcomes == [Outcome.DELIVERED] * 6
    # After its first, the run's five in batches of two (the third reading is past 0.5 s),
    # each begun afresh: the ones let go are begun again by the next.
    begun = [q["sql"] for q in captured.captured_queries if "WITH chosen AS" in q["sql"]]
    assert len(begun) == 3
    assert [r.headers["webhook-id"] for r in receiver.requests()] == [
        d.message_id for d in deliveries(endpoint)[1:]
    ]
    assert not WebhookDelivery.objects.filter(attempt_started_at__isnull=False).exists()
    assert due_deliver_runs() == []


def test_an_event_never_joins_a_run_at_work_or_whose_worker_died_in_it(
    receiver, make_endpoint, tenant
):
    endpoint = a_fast_endpoint(make_endpoint, tenant, receiver)
    with transaction.atomic():
        for _ in range(3):
            complete_a_job(tenant)
    first, *rest = deliveries(endpoint)[1:]
    # Its worker began the first (and is at it, or died there: its lease will tell).
    WebhookDelivery.objects.filter(pk=first.pk).update(attempt_started_at=first.created_at)

    complete_a_job(tenant)

    new = deliveries(endpoint)[-1]
    assert new.scheduled_run_id not in (None, first.scheduled_run_id)
    assert {d.scheduled_run_id for d in rest} == {first.scheduled_run_id}
