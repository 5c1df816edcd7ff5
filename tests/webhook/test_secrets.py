"""Webhook signing secrets at rest: encrypted in the database under keys that can rotate,
and the previous secret gone from its row once its grace has ended."""

from __future__ import annotations

import uuid
from datetime import timedelta
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from common.ways_forward import stranded_checks
from outbox.catalog import get_catalog
from outbox.handlers import TaskMessage
from outbox.models import OutboxMessage
from tests.common.test_settings import start
from tests.webhook.conftest import run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook.models import WebhookEndpoint
from webhook.secret_box import UnreadableSecret
from webhook.services import endpoint_rotate_secret
from webhook.stranded_secrets import MARGIN, secrets_stranded
from worker.registry import discover_handlers

pytestmark = pytest.mark.django_db


def stored(endpoint_id: int) -> tuple[str, str, object]:
    """The row as PostgreSQL holds it, past the model."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT secret, previous_secret, previous_secret_expires_at "
            "FROM webhook_endpoints WHERE id = %s",
            [endpoint_id],
        )
        return cursor.fetchone()


@pytest.fixture
def api(manager):
    client = APIClient()
    client.force_authenticate(manager)
    return client


def test_the_secret_is_encrypted_in_the_database(api, receiver, tenant):
    created = api.post(
        "/api/v1/webhooks", {"url": receiver.url, "event_types": ["JobCompleted"]}, format="json"
    ).json()
    rotated = api.post(f"/api/v1/webhooks/{created['id']}/rotate-secret").json()

    secret, previous, _expires = stored(created["id"])
    assert created["secret"] not in secret + previous
    assert rotated["secret"] not in secret + previous
    # Neither the secret nor its random part, whatever the encoding.
    for shown in (created["secret"], rotated["secret"]):
        assert shown.removeprefix("whsec_") not in secret + previous
    assert secret.startswith("gAAAAA") and previous.startswith("gAAAAA")
    # The hub still reads them and signs with both during the grace.
    endpoint = WebhookEndpoint.objects.get(pk=created["id"])
    assert endpoint.signing_secrets(timezone.now()) == [rotated["secret"], created["secret"]]
    complete_a_job(tenant)
    run_due_attempts()
    (request,) = receiver.requests()
    assert len(request.headers["webhook-signature"].split()) == 2


def test_rotating_the_encryption_key_keeps_every_secret_readable(make_endpoint, settings):
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.WEBHOOK_SECRET_KEYS = [old_key]
    endpoint = make_endpoint("https://hooks.example.com/a")
    rotated = endpoint_rotate_secret(tenant=endpoint.tenant_id, endpoint_id=endpoint.pk, actor=None)
    secrets = [rotated.secret, rotated.previous_secret]

    # 1. The new key first, the old one kept: everything reads, new writes use the new key.
    settings.WEBHOOK_SECRET_KEYS = [new_key, old_key]
    endpoint = WebhookEndpoint.objects.get(pk=endpoint.pk)
    assert [endpoint.secret, endpoint.previous_secret] == secrets
    # 2. Everything encrypted again under the new key.
    out = StringIO()
    call_command("reencrypt_webhook_secrets", stdout=out)
    assert "1 webhook endpoints" in out.getvalue()
    secret, previous, _expires = stored(endpoint.pk)
    assert Fernet(new_key).decrypt(secret.encode()).decode() == secrets[0]
    assert Fernet(new_key).decrypt(previous.encode()).decode() == secrets[1]
    # 3. The old key removed: still readable.
    settings.WEBHOOK_SECRET_KEYS = [new_key]
    endpoint = WebhookEndpoint.objects.get(pk=endpoint.pk)
    assert [endpoint.secret, endpoint.previous_secret] == secrets


def test_a_secret_under_a_key_no_longer_configured_is_a_clear_error(make_endpoint, settings):
    settings.WEBHOOK_SECRET_KEYS = [Fernet.generate_key().decode()]
    endpoint = make_endpoint("https://hooks.example.com/a")
    settings.WEBHOOK_SECRET_KEYS = [Fernet.generate_key().decode()]

    with pytest.raises(UnreadableSecret, match="reencrypt_webhook_secrets"):
        WebhookEndpoint.objects.get(pk=endpoint.pk)


def expire_runs() -> list[OutboxMessage]:
    return list(
        OutboxMessage.objects.filter(envelope__task="webhook.expire_secrets", sent_at__isnull=True)
    )


def run_expire(row: OutboxMessage) -> None:
    """What the background worker does with the webhook.expire_secrets message (once the
    relay sent it, when due)."""
    envelope = row.envelope
    discover_handlers()["webhook.expire_secrets"](
        TaskMessage(
            run_id=uuid.UUID(envelope["run_id"]),
            task=envelope["task"],
            payload=envelope["payload"],
            tenant=envelope["tenant"],
            receive_count=1,
            envelope=envelope,
        )
    )


def test_the_rotation_commits_the_run_that_erases_the_old_secret_when_its_grace_ends(
    make_endpoint, settings
):
    settings.WEBHOOK_SECRET_GRACE_SECONDS = 3600
    endpoint = make_endpoint("https://hooks.example.com/a")
    before = timezone.now()

    endpoint_rotate_secret(tenant=endpoint.tenant_id, endpoint_id=endpoint.pk, actor=None)

    (row,) = expire_runs()
    assert row.envelope["payload"] == {"endpoint_id": endpoint.pk}
    assert row.envelope["tenant"] == endpoint.tenant_id
    assert get_catalog().task("webhook.expire_secrets").queue == "maintenance"
    # Due when the grace ends, not before: the old secret signs until then.
    assert before + timedelta(seconds=3600) < row.available_at
    assert row.available_at < timezone.now() + timedelta(seconds=3600 + 60)


def runs_by_endpoint() -> dict[int, OutboxMessage]:
    return {row.envelope["payload"]["endpoint_id"]: row for row in expire_runs()}


def test_after_its_grace_the_previous_secret_is_gone_from_the_row(make_endpoint, time_machine):
    grace = timedelta(seconds=86400)
    first = make_endpoint("https://hooks.example.com/a")
    second = make_endpoint("https://hooks.example.com/b")
    first_rotated = timezone.now()
    endpoint_rotate_secret(tenant=first.tenant_id, endpoint_id=first.pk, actor=None)
    time_machine.move_to(first_rotated + timedelta(hours=12))
    endpoint_rotate_secret(tenant=second.tenant_id, endpoint_id=second.pk, actor=None)
    current = WebhookEndpoint.objects.get(pk=first.pk).secret
    runs = runs_by_endpoint()

    # The first grace ends (a day after its rotation): its run erases that secret only.
    time_machine.move_to(first_rotated + grace + timedelta(seconds=1))
    run_expire(runs[first.pk])

    assert stored(first.pk)[1:] == ("", None)
    assert WebhookEndpoint.objects.get(pk=first.pk).secret == current
    # A run early (a duplicate, a clock ahead) erases nothing still in its grace.
    run_expire(runs[second.pk])
    assert stored(second.pk)[1] != ""
    time_machine.move_to(first_rotated + timedelta(hours=12) + grace + timedelta(seconds=1))
    run_expire(runs[second.pk])
    assert stored(second.pk)[1:] == ("", None)


def test_a_second_rotation_within_the_grace_keeps_the_newer_old_secret(make_endpoint, time_machine):
    endpoint = make_endpoint("https://hooks.example.com/a")
    rotated = timezone.now()
    endpoint_rotate_secret(tenant=endpoint.tenant_id, endpoint_id=endpoint.pk, actor=None)
    time_machine.move_to(rotated + timedelta(hours=23))
    again = endpoint_rotate_secret(tenant=endpoint.tenant_id, endpoint_id=endpoint.pk, actor=None)
    first_run = min(expire_runs(), key=lambda row: row.id)

    time_machine.move_to(rotated + timedelta(hours=24, seconds=1))
    run_expire(first_run)

    # The first rotation's run came due, but the old secret now is the second's, in grace.
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).previous_secret == again.previous_secret


def test_the_reencryption_erases_what_is_past_its_grace(make_endpoint):
    endpoint = make_endpoint("https://hooks.example.com/a")
    endpoint_rotate_secret(tenant=endpoint.tenant_id, endpoint_id=endpoint.pk, actor=None)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        previous_secret_expires_at=timezone.now() - timedelta(seconds=1)
    )

    call_command("reencrypt_webhook_secrets", stdout=StringIO())

    assert stored(endpoint.pk)[1:] == ("", None)


def test_a_rotation_without_grace_keeps_no_previous_secret(make_endpoint, settings):
    settings.WEBHOOK_SECRET_GRACE_SECONDS = 0
    endpoint = make_endpoint("https://hooks.example.com/a")

    endpoint_rotate_secret(tenant=endpoint.tenant_id, endpoint_id=endpoint.pk, actor=None)

    assert stored(endpoint.pk)[1:] == ("", None)
    assert expire_runs() == []


# --- the keys at start-up -------------------------------------------------------------------


def production(**variables: str) -> dict[str, str]:
    return {"DEBUG": "false", "SECRET_KEY": "a-real-key-" + "x" * 40, **variables}


def test_production_refuses_to_start_without_webhook_secret_keys():
    result = start(production(), unset=("WEBHOOK_SECRET_KEYS",))
    assert result.returncode != 0
    assert "WEBHOOK_SECRET_KEYS must be set" in result.stderr


def test_production_refuses_to_start_with_the_development_key():
    from django.conf import settings

    (development_key,) = settings.WEBHOOK_SECRET_KEYS  # the tests run in DEBUG
    result = start(
        production(WEBHOOK_SECRET_KEYS=f"{Fernet.generate_key().decode()},{development_key}")
    )
    assert result.returncode != 0
    assert "development key" in result.stderr


def test_a_key_that_is_not_a_fernet_key_is_refused_at_start_up():
    result = start(production(WEBHOOK_SECRET_KEYS="not-a-key"))
    assert result.returncode != 0
    assert "WEBHOOK_SECRET_KEYS" in result.stderr and "not-a-key" not in result.stderr


def test_production_starts_with_real_keys():
    keys = f" {Fernet.generate_key().decode()} , {Fernet.generate_key().decode()} "
    result = start(production(WEBHOOK_SECRET_KEYS=keys))
    assert result.returncode == 0, result.stderr


# --- the rows written before the encryption -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_encrypts_the_secrets_already_stored(tenant):
    from django.db.migrations.executor import MigrationExecutor

    from webhook.secret_box import unseal

    plain, previous, expired = "whsec_" + "A" * 44, "whsec_" + "B" * 44, "whsec_" + "C" * 44
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("webhook")
    executor.migrate([("webhook", "0001_initial")])
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO webhook_endpoints (tenant_id, url, description, event_types, "
                "secret, previous_secret, previous_secret_expires_at, status, disabled_reason, "
                "answers_fast, created_at, updated_at) VALUES "
                "(%s, 'https://hooks.example.com/a', '', '{JobCompleted}', %s, %s, "
                " now() + interval '1 hour', 'active', '', false, now(), now()), "
                "(%s, 'https://hooks.example.com/b', '', '{JobCompleted}', %s, %s, "
                " now() - interval '1 hour', 'active', '', false, now(), now()) "
                "RETURNING id",
                [tenant.pk, plain, previous, tenant.pk, plain, expired],
            )
            in_grace, past_grace = (row[0] for row in cursor.fetchall())
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(latest)

    secret, kept, _expires = stored(in_grace)
    assert plain not in secret and previous not in kept
    assert (unseal(secret), unseal(kept)) == (plain, previous)
    assert WebhookEndpoint.objects.get(pk=in_grace).signing_secrets(timezone.now()) == [
        plain,
        previous,
    ]
    # Past its grace already: erased, not encrypted.
    assert stored(past_grace)[1:] == ("", None)
    assert unseal(stored(past_grace)[0]) == plain


# --- the monitor's check ----------------------------------------------------------------------


def test_the_secrets_check_is_registered_for_the_monitor():
    assert stranded_checks()["webhook_secrets"] is secrets_stranded


def test_a_previous_secret_left_past_its_grace_is_erased_by_the_monitors_check(make_endpoint):
    # Kept from before the expiry runs existed (or its run lost): nothing else would erase it.
    left, just_expired, in_grace = (
        make_endpoint(f"https://hooks.example.com/{n}") for n in range(3)
    )
    for endpoint in (left, just_expired, in_grace):
        endpoint_rotate_secret(tenant=endpoint.tenant_id, endpoint_id=endpoint.pk, actor=None)
    now = timezone.now()
    WebhookEndpoint.objects.filter(pk=left.pk).update(
        previous_secret_expires_at=now - MARGIN - timedelta(seconds=1)
    )
    # Its run may still be on its way through the maintenance queue.
    WebhookEndpoint.objects.filter(pk=just_expired.pk).update(
        previous_secret_expires_at=now - timedelta(seconds=1)
    )

    (repaired,) = secrets_stranded()

    assert repaired.row == f"webhook endpoint {left.pk}"
    assert repaired.action == "erased" and repaired.repaired
    assert stored(left.pk)[1:] == ("", None)
    assert stored(just_expired.pk)[1] != "" and stored(in_grace.pk)[1] != ""
    assert secrets_stranded() == []
