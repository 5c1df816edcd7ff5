"""Sector use cases: each change is one transaction with exactly one event."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from automation.services import automation_create
from common.errors import Conflict, InvalidInput
from outbox.models import Event, PlatformOutboxMessage
from sector.models import Sector
from sector.selectors import sector_lock_for_use
from sector.services import sector_create, sector_deactivate, sector_update
from tests.factories import AutomationFactory, SectorFactory
from tests.polling import wait_until

pytestmark = pytest.mark.django_db


def test_creating_a_sector_records_sector_created_once(platform_admin, events):
    sector = sector_create(name="  Finance ", description="Money", actor=platform_admin)

    assert (sector.name, sector.slug, sector.is_active) == ("Finance", "finance", True)
    event = Event.objects.get()
    assert (event.type, event.aggregate_type, event.aggregate_id) == (
        "SectorCreated",
        "Sector",
        str(sector.id),
    )
    assert event.payload["sector_id"] == sector.id
    assert event.actor == f"user:{platform_admin.id}" and event.tenant_id is None


def test_an_explicit_slug_is_kept(platform_admin):
    assert sector_create(name="Finance", slug="fin", actor=platform_admin).slug == "fin"


@pytest.mark.parametrize(
    ("name", "slug", "field"),
    [("", "", "name"), ("   ", "x", "name"), ("!!!", "", "slug"), ("Ok", "not a slug", "slug")],
)
def test_invalid_names_and_slugs_are_refused_without_an_event(platform_admin, name, slug, field):
    with pytest.raises(InvalidInput) as refused:
        sector_create(name=name, slug=slug, actor=platform_admin)

    assert field in refused.value.details
    assert not Sector.objects.exists() and not Event.objects.exists()


def test_an_active_sector_name_cannot_be_reused_whatever_its_case(platform_admin):
    sector_create(name="Finance", actor=platform_admin)

    with pytest.raises(Conflict) as refused:
        sector_create(name="FINANCE", slug="finance-2", actor=platform_admin)

    assert refused.value.code == "sector_name_taken"
    assert Event.objects.count() == 1


def test_a_slug_is_never_reused(platform_admin):
    SectorFactory(slug="finance", is_active=False)

    with pytest.raises(Conflict) as refused:
        sector_create(name="Finance", actor=platform_admin)

    assert refused.value.code == "sector_slug_taken"


def test_the_name_of_a_retired_sector_can_be_reused(platform_admin):
    SectorFactory(name="Finance", slug="finance-old", is_active=False)

    assert sector_create(name="Finance", actor=platform_admin).is_active


def test_updating_records_sector_updated_with_the_changed_fields(platform_admin, sector, events):
    updated = sector_update(
        sector_id=sector.id,
        data={"name": "Logistics", "description": "Trucks"},
        actor=platform_admin,
    )

    assert (updated.name, updated.description) == ("Logistics", "Trucks")
    assert events() == ["SectorUpdated"]
    assert Event.objects.get().payload["changed"] == ["description", "name"]


def test_an_update_that_changes_nothing_records_no_event(platform_admin, sector, events):
    sector_update(sector_id=sector.id, data={"name": sector.name}, actor=platform_admin)

    assert events() == []


def test_an_update_cannot_take_another_active_sectors_name(platform_admin, sector, events):
    other = SectorFactory(name="Other")

    with pytest.raises(Conflict):
        sector_update(sector_id=sector.id, data={"name": "other"}, actor=platform_admin)

    assert events() == []
    sector.refresh_from_db()
    assert sector.name != other.name


def test_a_retired_sector_cannot_be_updated(platform_admin, events):
    retired = SectorFactory(is_active=False)

    with pytest.raises(Conflict) as refused:
        sector_update(sector_id=retired.id, data={"name": "New"}, actor=platform_admin)

    assert refused.value.code == "sector_inactive"
    assert events() == []


def test_deactivating_records_sector_deactivated_once(platform_admin, sector, events):
    retired = sector_deactivate(sector_id=sector.id, actor=platform_admin)

    assert not retired.is_active and retired.deactivated_at is not None
    assert events() == ["SectorDeactivated"]
    assert PlatformOutboxMessage.objects.count() == 0  # nothing subscribes to it yet

    with pytest.raises(Conflict) as again:
        sector_deactivate(sector_id=sector.id, actor=platform_admin)
    assert again.value.code == "sector_inactive"
    assert events() == ["SectorDeactivated"]


def test_deactivation_is_refused_while_active_automations_use_the_sector(
    platform_admin, sector, events
):
    AutomationFactory(sector=sector)
    AutomationFactory(sector=sector, is_active=False)

    with pytest.raises(Conflict) as refused:
        sector_deactivate(sector_id=sector.id, actor=platform_admin)

    assert refused.value.code == "sector_in_use"
    assert refused.value.details == {"active_automations": 1}
    sector.refresh_from_db()
    assert sector.is_active
    assert events() == []


def test_deactivation_succeeds_once_only_retired_automations_use_the_sector(platform_admin, sector):
    AutomationFactory(sector=sector, is_active=False)

    assert not sector_deactivate(sector_id=sector.id, actor=platform_admin).is_active


# --- Concurrency: the rule holds when a deactivation and a new automation race ----------


def wait_until_blocked_on_a_lock(thread: threading.Thread) -> None:
    """Poll PostgreSQL until another session waits for this one (or the thread has ended)."""

    def blocked() -> bool:
        with connection.cursor() as cursor:
            # pg_stat_activity is a snapshot per transaction unless cleared.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
            )
            return bool(cursor.fetchone()[0])

    wait_until(
        lambda: not thread.is_alive() or blocked(),
        timeout=30,
        interval=0.01,
        message="the other session to wait for this one",
    )


def in_thread(target) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = target()
        except Exception as exc:  # handed to the test
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


@pytest.mark.django_db(transaction=True)
def test_a_sector_cannot_be_retired_while_an_automation_is_being_filed_under_it(
    platform_admin,
):
    sector = SectorFactory()
    with transaction.atomic():
        # The same first step automation_create takes: share-lock the sector.
        assert sector_lock_for_use(sector.id).is_active
        thread, outcome = in_thread(
            lambda: sector_deactivate(sector_id=sector.id, actor=platform_admin)
        )
        wait_until_blocked_on_a_lock(thread)
        AutomationFactory(sector=sector)
    thread.join()

    assert isinstance(outcome.get("error"), Conflict)
    assert outcome["error"].code == "sector_in_use"
    sector.refresh_from_db()
    assert sector.is_active


@pytest.mark.django_db(transaction=True)
def test_an_automation_cannot_be_filed_under_a_sector_being_retired(platform_admin):
    sector = SectorFactory()
    with transaction.atomic():
        sector_deactivate(sector_id=sector.id, actor=platform_admin)
        thread, outcome = in_thread(
            lambda: automation_create(
                name="Late", sector_id=sector.id, command=["true"], actor=platform_admin
            )
        )
        wait_until_blocked_on_a_lock(thread)
    thread.join()

    assert isinstance(outcome.get("error"), InvalidInput)
    assert outcome["error"].details == {"sector": ["The sector is not active."]}
    assert list(Event.objects.values_list("type", flat=True)) == ["SectorDeactivated"]
