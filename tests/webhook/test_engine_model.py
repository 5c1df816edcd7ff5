"""The delivery engine as a state machine, driven by Hypothesis over the real database and a
real receiver on loopback.

Random sequences of: events recorded (each joins its endpoint's run due now, or takes a
run of its own); the receiver's answers (2xx fast or slow, 4xx, 5xx, 429 with
Retry-After, timeouts, redirects, and its port closed: connection refused); secret
rotations; disable and enable; a worker that claimed a run and died before its attempt,
or in the middle of its run (before or after the receiver had the delivery it was at);
a run whose time runs out after some of its deliveries (the rest handed on); the run's
lease bringing a dead worker's message back; the clock moving on. The engine is driven
by calling the task's handler directly on the outbox rows due by the model's clock (the
rows' own due times are the database's clock; the delivery's ``next_attempt_at`` says
when its run is due), so no step sleeps. A run takes every delivery scheduled on it, and
stops short at a slow or failing answer.

After every step each pending delivery has a way forward: scheduled, its run is unsent in
the outbox or held by a dead worker whose lease will bring it back; parked, its endpoint is
active and has a scheduled delivery (the probe), or is disabled (held for its enable). At
the end, the receiver healthy, the endpoint enabled and the clock moving on, every delivery
ends, within a bound of rounds: each delivered one was answered 2xx at least once, and
more often only as many times as the hub did not read the answer (a timeout) or died
before recording it; every
request of a delivery is the same message (its webhook-id and body), so the receiver
deduping by webhook-id takes each event exactly once.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta
from unittest import mock

import pytest
import time_machine
from django.db import transaction
from django.utils import timezone
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from common.errors import Conflict
from outbox.models import OutboxMessage
from tests.factories import ManagerFactory, TenantFactory
from tests.ports import free_port
from tests.webhook.conftest import Receiver, Reply, run_attempt
from tests.webhook.test_delivery import complete_a_job
from webhook import delivery as engine
from webhook import transport
from webhook.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhook.services import (
    endpoint_create,
    endpoint_disable,
    endpoint_enable,
    endpoint_rotate_secret,
)

ANSWERS = {
    "ok": Reply(status=200),
    "created": Reply(status=201),
    # Delivered, but slower than WEBHOOK_SLOW_SECONDS (0.02 s here): its run stops there.
    "slow": Reply(status=200, delay=0.03),
    "bad request": Reply(status=400),
    "gone": Reply(status=410),
    "error": Reply(status=500),
    "unavailable": Reply(status=503),
    "too many": Reply(status=429, headers={"Retry-After": "3"}),
    # Past the read timeout (0.05 s here); what it answers late is never read.
    "timeout": Reply(status=503, delay=0.2),
    "redirect": Reply(status=302, headers={"Location": "http://127.0.0.1:9/elsewhere"}),
}
CLOCK_MOVES = [1, 3, 10, 31, 120, 900]
# Rounds of the final drain at most: each moves the clock past the longest wait.
DRAIN_ROUNDS = 60


class WorkerKilled(BaseException):
    """The worker process ends where it stands (no handler, no bookkeeping runs on)."""


def closed_port() -> int:
    # A port nothing listens on (below the ephemeral range: no outgoing connection takes it).
    return free_port()


class DeliveryEngine(RuleBasedStateMachine):
    receiver: Receiver  # set by the test, one for all examples

    def __init__(self) -> None:
        super().__init__()
        self._example = transaction.atomic()
        self._example.__enter__()
        self.receiver.received.clear()
        while not self.receiver.replies.empty():
            self.receiver.replies.get_nowait()
        self.receiver.default = Reply()
        self.now: datetime = timezone.now()
        self.tenant = TenantFactory()
        self.manager = ManagerFactory(tenant=self.tenant)
        with self.clock():
            self.endpoint = endpoint_create(
                tenant=self.tenant,
                url=self.receiver.url,
                event_types=["JobCompleted"],
                actor=self.manager,
            )
            complete_a_job(self.tenant)  # something to deliver from the start
        self.refused_url = f"http://127.0.0.1:{closed_port()}/hooks"
        # Runs a worker claimed and died with: their messages come back (lease expired).
        self.lost: dict[uuid.UUID, OutboxMessage] = {}
        # 2xx answers a worker had and died before recording, by webhook-id.
        self.unrecorded: Counter[str] = Counter()

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            transaction.set_rollback(True)
            self._example.__exit__(None, None, None)

    def clock(self):
        return time_machine.travel(self.now, tick=False)

    def _endpoint(self) -> WebhookEndpoint:
        return WebhookEndpoint.objects.get(pk=self.endpoint.pk)

    # --- the outside world --------------------------------------------------------------

    @rule(count=st.integers(1, 5))
    def events_recorded(self, count):
        with self.clock():
            for _ in range(count):
                complete_a_job(self.tenant)

    @rule(answers=st.lists(st.sampled_from(sorted(ANSWERS)), min_size=1, max_size=4))
    def receiver_answers(self, answers):
        self.receiver.script(*(ANSWERS[name] for name in answers))

    @rule(answer=st.sampled_from(sorted(ANSWERS)))
    def receiver_answers_from_now_on(self, answer):
        self.receiver.default = ANSWERS[answer]

    @rule(down=st.booleans())
    def receiver_port(self, down):
        # Its port closed (connection refused) or open again; the endpoint's address stays
        # what the tenant registered, as far as the engine knows.
        url = self.refused_url if down else self.receiver.url
        WebhookEndpoint.objects.filter(pk=self.endpoint.pk).update(url=url)

    @rule(seconds=st.sampled_from(CLOCK_MOVES))
    def clock_moves(self, seconds):
        self.now += timedelta(seconds=seconds)

    # --- people -------------------------------------------------------------------------

    @rule()
    def secret_rotated(self):
        with self.clock():
            try:
                endpoint_rotate_secret(
                    tenant=self.tenant, endpoint_id=self.endpoint.pk, actor=self.manager
                )
            except Conflict as refusal:
                assert refusal.code == "webhook_disabled"

    @rule(enable=st.booleans())
    def disabled_or_enabled(self, enable):
        with self.clock():
            try:
                if enable:
                    endpoint_enable(
                        tenant=self.tenant, endpoint_id=self.endpoint.pk, actor=self.manager
                    )
                else:
                    endpoint_disable(
                        tenant=self.tenant, endpoint_id=self.endpoint.pk, actor=self.manager
                    )
            except Conflict as refusal:
                assert refusal.code == ("webhook_active" if enable else "webhook_disabled")

    # --- the workers --------------------------------------------------------------------

    def _due_rows(self) -> list[OutboxMessage]:
        """Unsent webhook.deliver rows due by the model's clock: a delivery's current run
        when its next_attempt_at has come, any stale run at once (it does nothing)."""
        due_at = dict(
            WebhookDelivery.objects.filter(
                endpoint=self.endpoint, scheduled_run_id__isnull=False
            ).values_list("scheduled_run_id", "next_attempt_at")
        )
        rows = OutboxMessage.objects.filter(
            envelope__task="webhook.deliver", sent_at__isnull=True
        ).order_by("id")
        due = []
        for row in rows:
            run_id = uuid.UUID(row.envelope["run_id"])
            at = due_at.get(run_id)
            if at is None or at <= self.now:
                due.append(row)
        return due

    def _send(self, row: OutboxMessage) -> None:
        OutboxMessage.objects.filter(pk=row.pk).update(sent_at=self.now)

    @rule(limit=st.integers(1, 5))
    def due_runs_attempted(self, limit):
        with self.clock():
            for row in self._due_rows()[:limit]:
                self._send(row)
                run_attempt(row)

    @precondition(lambda self: len(self.lost) < 3)
    @rule()
    def a_worker_dies_mid_attempt(self):
        with self.clock():
            rows = self._due_rows()
            if not rows:
                return
            row = rows[0]
            self._send(row)
            # It claimed the run and began the attempt; it never sent the request.
            run_id = uuid.UUID(row.envelope["run_id"])
            engine._begin(row.envelope["payload"]["delivery_id"], run_id)
            self.lost[run_id] = row

    @precondition(lambda self: len(self.lost) < 3)
    @rule(delivered=st.integers(0, 5), answered=st.booleans())
    def a_worker_dies_mid_run(self, delivered, answered):
        """A worker takes a due run, makes ``delivered`` attempts of it, and dies in the
        next one: before its request, or after the receiver had it (``answered``)."""
        rows = self._due_rows()
        if not rows:
            return
        row = rows[0]
        post = transport.post
        calls = 0
        answers: Counter[str] = Counter()  # 2xx answers the worker had, by webhook-id

        def dying_post(url, body, headers):
            nonlocal calls
            calls += 1
            if calls > delivered and not answered:
                raise WorkerKilled
            answer = post(url, body, headers)
            if answer.status_code is not None and 200 <= answer.status_code < 300:
                answers[headers["webhook-id"]] += 1
            if calls > delivered:
                raise WorkerKilled
            return answer

        recorded_before = self._recorded_successes()

        self._send(row)
        run_id = uuid.UUID(row.envelope["run_id"])
        with self.clock(), mock.patch.object(transport, "post", dying_post):
            try:
                run_attempt(row)
            except WorkerKilled:
                pass
            else:
                return  # the run ended before the worker died
        # The answers it had and did not record (the one it was at, and those of its batch
        # recorded together after the batch) the receiver gets again.
        recorded = self._recorded_successes() - recorded_before
        self.unrecorded.update(answers - recorded)
        # Its database session ends with it, and the locks of the attempts it was at.
        for delivery_id in WebhookDelivery.objects.filter(
            scheduled_run_id=run_id, attempt_started_at__isnull=False
        ).values_list("id", flat=True):
            engine._let_go_attempt(delivery_id)
        self.lost[run_id] = row

    def _recorded_successes(self) -> Counter[str]:
        return Counter(
            WebhookAttempt.objects.filter(
                delivery__endpoint=self.endpoint, status_code__gte=200, status_code__lt=300
            ).values_list("delivery__message_id", flat=True)
        )

    @rule(taken=st.integers(1, 3))
    def a_runs_time_runs_out(self, taken):
        """A due run whose deadline passes after ``taken`` deliveries: it begins no more,
        and hands the rest on."""
        rows = self._due_rows()
        if not rows:
            return
        row = rows[0]
        clock = iter([0.0] * (taken - 1))

        def monotonic():
            return next(clock, 2.0)  # past the deadline (1.0) from the taken-th check on

        self._send(row)
        with self.clock(), mock.patch.object(engine, "monotonic", monotonic):
            engine.deliveries_run(
                delivery_id=row.envelope["payload"]["delivery_id"],
                run_id=uuid.UUID(row.envelope["run_id"]),
                deadline=1.0,
            )

    @precondition(lambda self: self.lost)
    @rule()
    def a_lost_runs_lease_expires(self):
        # The broker shows the message again, to a live worker.
        self.now += timedelta(seconds=60)
        run_id, row = next(iter(self.lost.items()))
        del self.lost[run_id]
        with self.clock():
            run_attempt(row)

    # --- what must hold -----------------------------------------------------------------

    @invariant()
    def every_pending_delivery_has_a_way_forward(self):
        endpoint = self._endpoint()
        unsent = {
            uuid.UUID(run_id)
            for run_id in OutboxMessage.objects.filter(
                envelope__task="webhook.deliver", sent_at__isnull=True
            ).values_list("envelope__run_id", flat=True)
        }
        pending = list(WebhookDelivery.objects.filter(endpoint=endpoint, status="pending"))
        scheduled = [d for d in pending if d.scheduled_run_id is not None]
        for delivery in pending:
            if delivery.scheduled_run_id is not None:
                assert delivery.next_attempt_at is not None, delivery
                assert delivery.scheduled_run_id in unsent | set(self.lost), delivery
            elif endpoint.is_active:
                assert scheduled, f"{delivery} is parked and its endpoint has no probe"
        for delivery in WebhookDelivery.objects.filter(endpoint=endpoint).exclude(status="pending"):
            assert delivery.scheduled_run_id is None and delivery.finished_at is not None

    @invariant()
    def one_delivery_per_event(self):
        events = Counter(
            WebhookDelivery.objects.filter(endpoint=self.endpoint).values_list(
                "event_id", flat=True
            )
        )
        assert max(events.values(), default=0) <= 1

    # --- the end ------------------------------------------------------------------------

    def _drain(self) -> None:
        while not self.receiver.replies.empty():
            self.receiver.replies.get_nowait()
        self.receiver.default = Reply()
        WebhookEndpoint.objects.filter(pk=self.endpoint.pk).update(url=self.receiver.url)
        if not self._endpoint().is_active:
            with self.clock():
                endpoint_enable(tenant=self.tenant, endpoint_id=self.endpoint.pk, actor=None)
        for _ in range(DRAIN_ROUNDS):
            pending = WebhookDelivery.objects.filter(endpoint=self.endpoint, status="pending")
            if not pending.exists():
                break
            self.now += timedelta(seconds=61)
            with self.clock():
                for row in list(self.lost.values()) + self._due_rows():
                    self._send(row)
                    run_attempt(row)
            self.lost.clear()
            self.every_pending_delivery_has_a_way_forward()
        leftover = list(WebhookDelivery.objects.filter(endpoint=self.endpoint, status="pending"))
        assert not leftover, f"still pending after {DRAIN_ROUNDS} rounds: {leftover}"

        answered_ok = Counter(
            request.headers["webhook-id"]
            for request in self.receiver.requests()
            if 200 <= request.answered < 300 and request.path == "/hooks"
        )
        bodies = {}
        for request in self.receiver.requests():
            # Every attempt of a delivery is the same message: what the receiver dedupes by.
            key = request.headers["webhook-id"]
            assert bodies.setdefault(key, request.body) == request.body
        for delivery in WebhookDelivery.objects.filter(endpoint=self.endpoint):
            # A 2xx the hub never read (it came after the timeout) is sent again: at least
            # once, and never again after the success was recorded.
            unread = WebhookAttempt.objects.filter(delivery=delivery, status_code=None).count()
            unread += self.unrecorded[delivery.message_id]
            received = answered_ok[delivery.message_id]
            if delivery.status == "delivered":
                assert 1 <= received <= 1 + unread, (delivery, received, unread)
            else:
                assert received <= unread, (delivery, received, unread, delivery.last_error)


@pytest.mark.django_db
def test_every_delivery_keeps_a_way_forward_and_is_delivered_once(receiver, settings):
    settings.WEBHOOK_READ_TIMEOUT = 0.05
    settings.WEBHOOK_SLOW_SECONDS = 0.02
    settings.WEBHOOK_CONNECT_TIMEOUT = 0.2
    settings.WEBHOOK_TIMEOUT = 1.0
    settings.WEBHOOK_RETRY_DELAYS = [1.0, 5.0, 30.0, 120.0]
    settings.WEBHOOK_PROBE_MAX_SECONDS = 30.0
    settings.WEBHOOK_DISABLE_AFTER_SECONDS = 1800
    DeliveryEngine.receiver = receiver
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        DeliveryEngine,
        settings=hypothesis_settings(
            parent=hypothesis_settings.default, max_examples=100, stateful_step_count=20
        ),
    )
