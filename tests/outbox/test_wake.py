"""The Redis wake signal: after commit only, never on rollback, never fatal."""

from __future__ import annotations

import pytest
from django.db import transaction

from outbox.models import PlatformOutboxMessage
from outbox.services import dispatch
from outbox.wake import signal_relay
from tests.ports import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_signal_is_pushed_only_after_commit(settings, redis_conn):
    key = settings.OUTBOX_WAKE_KEY
    with transaction.atomic():
        dispatch("maintenance.purge", {})
        assert redis_conn.llen(key) == 0, "signalled before the commit"
    assert redis_conn.llen(key) == 1


def test_no_signal_on_rollback(settings, redis_conn):
    with pytest.raises(RuntimeError), transaction.atomic():
        dispatch("maintenance.purge", {})
        raise RuntimeError("abort")
    assert redis_conn.llen(settings.OUTBOX_WAKE_KEY) == 0


def test_one_signal_per_transaction_and_the_list_stays_bounded(settings, redis_conn):
    with transaction.atomic():
        for _ in range(10):
            dispatch("maintenance.purge", {})
    for _ in range(5):
        with transaction.atomic():
            dispatch("maintenance.purge", {})
    assert redis_conn.llen(settings.OUTBOX_WAKE_KEY) == 1


def test_with_redis_unreachable_the_transaction_still_commits(settings, caplog):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    with transaction.atomic():
        run_id = dispatch("maintenance.purge", {})
    assert PlatformOutboxMessage.objects.filter(run_id=run_id).exists()
    assert "wake signal not sent" in caplog.text


def test_signal_relay_reports_failure_instead_of_raising(settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    assert signal_relay() is False
