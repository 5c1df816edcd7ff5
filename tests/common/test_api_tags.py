"""The API docs group the operations by app: each under its resource's tag, every tag
described, the worker's own calls (poll, claim, heartbeat, reports) under one."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.generators import SchemaGenerator


def operations() -> dict[str, list[str]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return {
        operation["operationId"]: operation["tags"]
        for path in schema["paths"].values()
        for operation in path.values()
    }


def test_every_operation_has_one_described_tag_and_the_api_has_several():
    described = {tag["name"] for tag in settings.SPECTACULAR_SETTINGS["TAGS"]}
    tags = operations()
    assert all(len(names) == 1 and names[0] in described for names in tags.values()), tags
    assert {names[0] for names in tags.values()} == described


def test_the_workers_calls_are_under_one_tag_and_peoples_under_their_resource():
    tags = operations()
    for operation in (
        "worker_jobs_pending",
        "jobs_start",
        "jobs_heartbeat",
        "jobs_complete",
        "jobs_output_append",
    ):
        assert tags[operation] == ["worker"], operation
    assert tags["jobs_create"] == tags["jobs_output"] == ["jobs"]
    assert tags["schedules_create"] == ["schedules"]
    assert tags["webhooks_deliveries"] == ["webhooks"]
