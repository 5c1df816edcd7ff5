import json

import pytest

from outbox.catalog import CatalogError, get_catalog, load_catalog, parse_catalog


def test_the_shipped_catalog_loads_and_declares_the_purge_schedule():
    catalog = get_catalog()
    assert catalog.task("maintenance.purge").queue == "maintenance"
    assert any(s.task == "maintenance.purge" and s.every_seconds == 3600 for s in catalog.schedules)
    assert {spec.name for spec in catalog.subscribers("JobCreated")} >= {"machines.power_on"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"events": [], "tasks": [{"name": "a", "queue": "urgent"}]}, "unknown queue 'urgent'"),
        (
            {
                "events": [],
                "tasks": [{"name": "a", "queue": "bulk"}, {"name": "a", "queue": "bulk"}],
            },
            "duplicate task name 'a'",
        ),
        (
            {"events": [], "tasks": [{"name": "a", "queue": "bulk", "subscribes": ["Nope"]}]},
            "undeclared event 'Nope'",
        ),
        ({"events": ["E", "E"]}, "duplicate event names"),
        (
            {
                "tasks": [{"name": "a", "queue": "bulk"}],
                "schedules": [{"name": "s", "task": "b", "every_seconds": 5}],
            },
            "unknown task 'b'",
        ),
        (
            {"tasks": [{"name": "a", "queue": "bulk", "retry": {"max_receives": 0}}]},
            "max_receives",
        ),
    ],
)
def test_an_invalid_catalog_is_a_clear_start_up_error(data, message):
    with pytest.raises(CatalogError, match=message):
        parse_catalog(data)


def test_a_missing_or_malformed_file_names_the_path(tmp_path):
    with pytest.raises(CatalogError, match="not found"):
        load_catalog(tmp_path / "absent.json")
    broken = tmp_path / "tasks.json"
    broken.write_text("{not json")
    with pytest.raises(CatalogError, match="not valid JSON"):
        load_catalog(broken)
    broken.write_text(json.dumps({"tasks": [{"name": "x", "queue": "nope"}]}))
    with pytest.raises(CatalogError, match=str(broken)):
        load_catalog(broken)


def test_a_task_time_limit_comes_from_the_task_or_else_the_defaults():
    catalog = parse_catalog(
        {
            "defaults": {"time_limit_seconds": 45},
            "tasks": [
                {"name": "a", "queue": "default"},
                {"name": "b", "queue": "default", "time_limit_seconds": 2.5},
            ],
        }
    )
    assert catalog.task("a").time_limit_seconds == 45
    assert catalog.task("b").time_limit_seconds == 2.5
    assert parse_catalog({"tasks": [{"name": "c", "queue": "bulk"}]}).task("c").time_limit_seconds


@pytest.mark.parametrize("limit", [0, -1, "60", True, None])
def test_a_time_limit_that_is_not_a_positive_number_is_refused(limit):
    with pytest.raises(CatalogError, match="time_limit_seconds"):
        parse_catalog({"tasks": [{"name": "a", "queue": "default", "time_limit_seconds": limit}]})
