"""The run statements' arrays, sent as one literal each (``outbox.runs``): every value
arrives as it was, whatever it holds, and every form of run id a message may carry finds
its run."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from outbox.models import TaskRun
from outbox.runs import (
    Begin,
    Lease,
    RunLedger,
    canonical_run_id,
    float_array,
    text_array,
    uuid_array,
)

pytestmark = pytest.mark.django_db

AWKWARD = ['a"b', "c\\d", "e,f", "{g}", " h ", "NULL", "", "ü", "'", '\\"', "x y"]


def round_trip(sql: str, literal: str) -> list:
    with connection.cursor() as cursor:
        cursor.execute(sql, [literal])
        return cursor.fetchone()[0]


def test_text_values_arrive_as_they_were():
    assert round_trip("SELECT %s::text[]", text_array(AWKWARD)) == AWKWARD
    assert round_trip("SELECT %s::text[]", text_array(["plain", "values"])) == ["plain", "values"]
    assert round_trip("SELECT %s::text[]", text_array([])) == []


def test_numbers_arrive_as_they_were():
    values = [0.0, 1.0, 2.5, 1e-7, 123456.789, 5]
    assert round_trip("SELECT %s::float8[]", float_array(values)) == [float(v) for v in values]


def test_run_ids_in_any_form_arrive_canonical():
    run_id = uuid.uuid4()
    forms = [str(run_id), str(run_id).upper(), f"{{{run_id}}}", run_id.urn, run_id.hex, run_id]
    assert {canonical_run_id(form) for form in forms} == {str(run_id)}
    assert round_trip("SELECT %s::uuid[]", uuid_array([str(f) for f in forms])) == [run_id] * 6
    assert round_trip("SELECT %s::uuid[]", uuid_array([])) == []


@pytest.mark.parametrize("bad", ["", "not-a-uuid", "1234", "{}", "a,b"])
def test_a_value_that_is_not_a_uuid_is_refused_before_any_statement(bad):
    with pytest.raises(ValueError):
        canonical_run_id(bad)
    with pytest.raises(ValueError):
        uuid_array([str(uuid.uuid4()), bad])


def test_a_window_whose_messages_carry_run_ids_in_other_forms_is_claimed_and_committed():
    ledger = RunLedger()
    run_ids = [uuid.uuid4() for _ in range(4)]
    TaskRun.objects.bulk_create(
        [TaskRun(run_id=run_id, task="test.work", queue="default") for run_id in run_ids]
    )
    forms = [str(run_ids[0]).upper(), f"{{{run_ids[1]}}}", run_ids[2].urn, str(run_ids[3])]
    # Holders as awkward as a host's name may make them.
    holders = ['host"1:1:a.1', "host\\2:1:a.2", "host,3:1:a.3", "host 4:1:a.4"]
    started = ledger.begin_many(
        [
            ({"run_id": form, "task": "test.work"}, holder, 30.0)
            for form, holder in zip(forms, holders, strict=True)
        ]
    )
    assert {holder: s.decision for holder, s in started.items()} == dict.fromkeys(
        holders, Begin.RUN
    )
    assert {
        str(run.run_id): run.lease_holder for run in TaskRun.objects.filter(run_id__in=run_ids)
    } == {str(run_id): holder for run_id, holder in zip(run_ids, holders, strict=True)}

    leases = [
        Lease(canonical_run_id(form), holder, 30.0, 10.0)
        for form, holder in zip(forms, holders, strict=True)
    ]
    assert ledger.extend(leases) == set(holders)
    assert ledger.succeeded_many(leases) == {str(run_id) for run_id in run_ids}
    assert set(TaskRun.objects.filter(run_id__in=run_ids).values_list("status", flat=True)) == {
        TaskRun.Status.SUCCEEDED
    }
