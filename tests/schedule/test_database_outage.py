"""The scheduler outlives a PostgreSQL restart and terminated backends, on a private cluster."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings as django_settings

from tests.polling import wait_until
from tests.private_services import Daemon, private_environment

pytestmark = pytest.mark.django_db(transaction=True)

SEED = """
from datetime import timedelta
from django.utils import timezone
from automation.models import Automation
from identity.models import Tenant
from schedule.models import Schedule
from sector.models import Sector

tenant = Tenant.objects.create(name="Outage", slug="outage")
sector = Sector.objects.create(name="Outage", slug="outage")
automation = Automation.objects.create(
    name="Outage", slug="outage", sector=sector, command=["true"]
)
Schedule.objects.create(
    tenant=tenant, automation=automation, name="before", cron="* * * * *",
    next_run_at=timezone.now() - timedelta(minutes=1),
)
"""

# A schedule added while the scheduler runs, due at once: a job it starts is proof that the
# scheduler works again.
ADD_DUE_SCHEDULE = """
INSERT INTO schedules (tenant_id, automation_id, name, cron, timezone, params, misfire,
    paused_reason, deactivated_reason, next_run_at, created_at, updated_at, is_active)
SELECT tenant_id, automation_id, %(name)s, cron, timezone, params, misfire, '', '',
    now() - interval '1 minute', now(), now(), true
FROM schedules ORDER BY id LIMIT 1
"""

JOBS_OF = """
SELECT j.id FROM jobs j JOIN schedules s ON s.id = (j.triggered_by->>'schedule')::int
WHERE s.name = %(name)s
"""


def test_the_scheduler_recovers_from_a_database_restart_and_terminated_backends(
    settings, private_postgres, migrated_database
):
    pg, database = private_postgres, migrated_database
    env = private_environment(settings, postgres=pg, database=database, LOG_LEVEL="info")
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SEED],
        cwd=django_settings.BASE_DIR,
        env=env,
        check=True,
        capture_output=True,
    )
    scheduler = Daemon("run_scheduler", "--interval", "0.2", env=env)
    try:
        scheduler.wait_for_line("jobs started", 30)

        for name, breaks in (
            ("restart", lambda: pg.restart("fast")),
            ("backends-terminated", lambda: pg.terminate_backends(database)),
        ):
            breaks()
            pg.execute(ADD_DUE_SCHEDULE, {"name": name}, dbname=database)
            # Its job, not a count in the log: the first schedule falls due every minute,
            # and when it fell due during the outage both start in one batch ("2 jobs
            # started").
            wait_until(
                lambda name=name: pg.execute(JOBS_OF, {"name": name}, dbname=database),
                timeout=30,
                message=lambda name=name: f"a job of the schedule {name!r}:\n{scheduler.log}",
            )
    finally:
        code = scheduler.stop()
    assert code == 0, scheduler.log
    # The outages were outlived, never as a traceback. (Whether a cycle met the database
    # down, and warned, or only found its connection dead at the start of the next cycle and
    # replaced it silently, depends on how long the restart took.)
    assert "Traceback" not in scheduler.log, scheduler.log
    jobs = pg.execute(
        "SELECT s.name FROM jobs j JOIN schedules s ON s.id = (j.triggered_by->>'schedule')::int "
        "ORDER BY j.id",
        dbname=database,
    )
    names = [row[0] for row in jobs]
    assert {"restart", "backends-terminated"} <= set(names)
    duplicates = pg.execute(
        "SELECT triggered_by FROM jobs GROUP BY triggered_by HAVING count(*) > 1",
        dbname=database,
    )
    assert duplicates == []
