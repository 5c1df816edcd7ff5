"""The re-encryption of the webhook secrets beside deliveries being recorded: it never waits
for one endpoint while it holds others, so an event's transaction that holds endpoints
(``FOR SHARE``, in whatever order its events come) cannot deadlock with it."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from tests.locks import Racer, another_session, until_another_waits
from webhook.models import WebhookEndpoint
from webhook.services import endpoint_secrets_reencrypt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

SHARE = "SELECT 1 FROM webhook_endpoints WHERE id = %s FOR SHARE"


def test_the_reencryption_goes_round_an_endpoint_an_event_holds(make_endpoint, settings):
    lower = make_endpoint("https://hooks.example.com/lower")
    higher = make_endpoint("https://hooks.example.com/higher")
    secrets = {e.pk: e.secret for e in (lower, higher)}
    new_key = Fernet.generate_key().decode()
    settings.WEBHOOK_SECRET_KEYS = [new_key, *settings.WEBHOOK_SECRET_KEYS]

    with another_session() as event:
        # An event's transaction: one endpoint held, its next one asked for after.
        event.execute(SHARE, [higher.pk])
        reencryption = Racer("reencrypt", endpoint_secrets_reencrypt).start()
        until_another_waits(done=reencryption.finished)
        event.execute(SHARE, [lower.pk])
        event.commit()
    done = reencryption.join()

    assert done == 2
    settings.WEBHOOK_SECRET_KEYS = [new_key]
    for endpoint in WebhookEndpoint.objects.filter(pk__in=secrets):
        assert endpoint.secret == secrets[endpoint.pk]
