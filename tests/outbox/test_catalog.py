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
