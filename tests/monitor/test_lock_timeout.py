"""A lost job whose rows another session keeps locked (a psql left in a transaction) costs
the monitor that one job's settling, named as a lock timeout: the other lost jobs are
settled in the same cycle, and nothing is logged as the database being away."""

from __future__ import annotations

import logging

import pytest
from django.db import connection

from job.models import Job
from tests.locks import another_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_a_job_behind_a_kept_lock_leaves_the_others_settled(monitor, lost, caplog):
    held, other = lost(), lost()  # the held one first, as the monitor lists them
    with another_session() as holder:
        # Its tenant's row, which the failure's event references.
        holder.execute("SELECT 1 FROM tenants WHERE id = %s FOR UPDATE", [held.tenant_id])
        # DB_LOCK_TIMEOUT, short for the test's sake, on the monitor's connection.
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '300ms'")
        try:
            with caplog.at_level(logging.INFO):
                monitor.cycle()
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        holder.rollback()

    lines = [f"{record.levelname} {record.getMessage()}" for record in caplog.records]
    assert Job.objects.get(pk=other.pk).status != "running", lines
    assert Job.objects.get(pk=held.pk).status == "running"
    assert not [line for line in lines if "unreachable" in line], lines
    assert [line for line in lines if line.startswith("ERROR") and "lock timeout" in line], lines
