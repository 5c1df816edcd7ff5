"""Zone names the tz database lists but whose files this machine lacks: a link is read as
the zone it names, anything else is a 400, never a 500.

Debian 13 (the base of ``python:3.11-slim``) moved the backward-compatible links
(``US/Eastern``, ``Asia/Calcutta``...) to the optional ``tzdata-legacy`` package, while the
list of names it ships (``tzdata.zi``) still holds them: a name can be listed and have no
file. Here a private time zone path holds such a list: UTC with its file, the link
``Legacy/Gone`` to UTC and the zone ``Lost/Zone``, both without one.
"""

from __future__ import annotations

import shutil
import zoneinfo
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schedule import calendar
from schedule.models import Schedule
from tests.schedule.test_api import URL, body

pytestmark = pytest.mark.django_db

LINK = "Legacy/Gone"
LOST = "Lost/Zone"


@pytest.fixture
def zone_path_without_some_listed_files(tmp_path):
    source = next(folder for folder in zoneinfo.TZPATH if (Path(folder) / "UTC").is_file())
    shutil.copy(Path(source) / "UTC", tmp_path / "UTC")
    (tmp_path / "tzdata.zi").write_text(
        f"Z UTC 0 - UTC\nZ {LOST} 0 - UTC\nL UTC {LINK}\n", encoding="utf-8"
    )

    def forget():
        calendar.zone_names.cache_clear()
        calendar._listing.cache_clear()
        zoneinfo.ZoneInfo.clear_cache(only_keys=[LINK, LOST])

    zoneinfo.reset_tzpath(to=[str(tmp_path)])
    forget()
    try:
        assert {LINK, LOST} <= calendar.zone_names()
        yield
    finally:
        zoneinfo.reset_tzpath()
        forget()


def test_a_listed_link_without_a_file_is_read_as_the_zone_it_names(
    zone_path_without_some_listed_files,
):
    assert calendar.zone_problem(LINK) is None
    assert calendar.next_due_after("0 6 * * *", LINK, datetime(2026, 3, 1, tzinfo=UTC)) == (
        datetime(2026, 3, 1, 6, tzinfo=UTC)
    )


def test_a_listed_zone_without_a_file_is_refused_with_the_reason(
    zone_path_without_some_listed_files,
):
    assert "cannot be read" in calendar.zone_problem(LOST)
    # The expression's own check does not raise for the zone: it is reported on its own.
    assert calendar.cron_problem("0 6 * * *", LOST) is None
    with pytest.raises(calendar.ZoneError):
        calendar.next_due_after("0 6 * * *", LOST, datetime(2026, 3, 1, tzinfo=UTC))


def test_a_schedule_in_a_listed_link_without_a_file_is_created(
    zone_path_without_some_listed_files, manager_api, automation
):
    response = manager_api.post(URL, body(automation, timezone=LINK), format="json")

    assert response.status_code == 201, response.content
    assert response.json()["timezone"] == LINK


def test_creating_a_schedule_in_a_listed_zone_without_a_file_is_a_400(
    zone_path_without_some_listed_files, manager_api, automation
):
    response = manager_api.post(URL, body(automation, timezone=LOST), format="json")

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_timezone"
    assert "cannot be read" in response.json()["error"]["details"]["timezone"][0]
    assert not Schedule.objects.exists()


def test_moving_a_schedule_to_a_listed_zone_without_a_file_is_a_400(
    zone_path_without_some_listed_files, manager_api, automation
):
    created = manager_api.post(URL, body(automation, timezone="UTC"), format="json")
    assert created.status_code == 201, created.content

    response = manager_api.patch(f"{URL}/{created.json()['id']}", {"timezone": LOST}, format="json")

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_timezone"
    assert Schedule.objects.get().timezone == "UTC"
