"""The admin's "Send again" and a worker's retry of the same run, at the same moment: both
take the run, then its outbox row, so neither waits for the other in a cycle."""

from __future__ import annotations

import threading

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from outbox import runs
from outbox.models import PlatformOutboxMessage, TaskRun
from outbox.runs import Begin, RunLedger
from outbox.services import dispatch
from tests.factories import PlatformAdminFactory
from tests.locks import Racer, in_racer, until_another_waits

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_send_again_while_a_worker_retries_the_run_is_no_deadlock(monkeypatch):
    with transaction.atomic():
        run_id = dispatch("machines.restart", {"automation_id": 1})
    row = PlatformOutboxMessage.objects.get(run_id=run_id)
    PlatformOutboxMessage.objects.filter(pk=row.pk).update(sent_at=row.created_at)
    envelope = dict(row.envelope)
    holder = "host:1:retrying"
    started = RunLedger().begin_many([(envelope, holder, 60.0)])
    assert started[holder].decision == Begin.RUN

    # The worker has marked the run retrying (its row locked) and is about to re-arm the
    # outbox row when the operator's action comes.
    reached, go = threading.Event(), threading.Event()
    rearm = runs.rearm_outbox_row

    def held_rearm(*args, **kwargs):
        if in_racer("worker"):
            reached.set()
            assert go.wait(60), "never let go"
        return rearm(*args, **kwargs)

    monkeypatch.setattr(runs, "rearm_outbox_row", held_rearm)
    admin = Client(raise_request_exception=False)
    admin.force_login(PlatformAdminFactory())

    worker = Racer(
        "worker",
        lambda: RunLedger().retrying(envelope, holder=holder, error="boom", delay=30.0, rearm=True),
    ).start()
    try:
        assert reached.wait(30)
        action = Racer(
            "admin",
            lambda: admin.post(
                "/admin/outbox/platformoutboxmessage/",
                {"action": "send_again", "_selected_action": [str(row.pk)]},
                follow=True,
            ),
        ).start()
        until_another_waits(done=action.finished)
    finally:
        go.set()
    worker.join()
    response = action.join()

    assert response.status_code == 200
    shown = [str(message) for message in response.context["messages"]]
    assert shown and all("1 " in message for message in shown), shown
    run = TaskRun.objects.get(run_id=run_id)
    assert run.status == TaskRun.Status.RETRYING
    # The operator's "due now" came last: the row is due now, not in 30 s.
    row.refresh_from_db()
    assert row.sent_at is None
    assert row.available_at <= timezone.now()
