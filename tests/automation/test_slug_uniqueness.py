"""An automation's slug: the pre-check compares it as the unique index does (exactly), and
a race the index decides answers the pre-check's 409, never a 500 or two rows."""

from __future__ import annotations

import pytest

from automation import services as automation_services
from automation.models import Automation
from tests.factories import AutomationWithWorkerFactory, PlatformAdminFactory, SectorFactory
from tests.locks import all_past, sent_together

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_two_creations_racing_past_the_check_for_one_slug_give_one_201_and_one_409(
    monkeypatch,
):
    admin = PlatformAdminFactory()
    sector = SectorFactory()
    all_past(monkeypatch, automation_services, "_require_free_slug")

    def create(name: str):
        return lambda client: client.post(
            "/api/v1/automations",
            {"name": name, "slug": "export", "sector": sector.id, "command": ["true"]},
            format="json",
        )

    answers = sent_together(admin, [create("One"), create("Two")])

    statuses = sorted(status for status, _ in answers)
    assert statuses == [201, 409], answers
    assert [body["error"]["code"] for status, body in answers if status == 409] == [
        "automation_slug_taken"
    ]
    assert Automation.objects.count() == 1


def test_a_change_that_keeps_the_slug_is_never_refused_over_it(monkeypatch):
    automation = AutomationWithWorkerFactory(slug="export")

    def taken(*_args, **_kwargs):
        raise AssertionError("the slug was checked though it did not change")

    monkeypatch.setattr(automation_services, "_require_free_slug", taken)
    updated = automation_services.automation_update(
        automation_id=automation.id,
        data={"slug": "export", "description": "x"},
        actor=PlatformAdminFactory(),
    )

    assert updated.description == "x"
