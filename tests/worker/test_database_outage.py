"""The background worker (and the relay feeding it) outlive a PostgreSQL restart and
terminated backends, on a private cluster: tasks dispatched after each run to success."""

from __future__ import annotations

import time

import pytest

from tests.polling import wait_until
from tests.private_services import Daemon, private_environment
from tests.relay.test_outages import insert_rows

pytestmark = pytest.mark.django_db(transaction=True)


def run_status(pg, database: str, run_id: str) -> str | None:
    try:
        rows = pg.execute(
            "SELECT status FROM task_runs WHERE run_id = %s", [run_id], dbname=database
        )
    except Exception:  # the database is restarting
        return None
    return rows[0][0] if rows else None


def test_the_worker_recovers_from_a_database_restart_and_terminated_backends(
    settings, private_postgres, migrated_database
):
    pg, database = private_postgres, migrated_database
    settings.BROKER = "rabbitmq"
    env = private_environment(
        settings, postgres=pg, database=database, BROKER="rabbitmq", HUBDOMMED_RELAY="true"
    )
    relay = Daemon("run_relay", env=env)
    worker = Daemon("run_worker", "--queues", "maintenance", "--concurrency", "2", env=env)
    try:
        (first,) = insert_rows(pg, database, 1)
        wait_until(
            lambda: run_status(pg, database, first) == "succeeded",
            timeout=60,
            message="a first run",
        )

        for name, breaks in (
            ("restart", lambda: pg.restart("fast")),
            ("backends terminated", lambda: pg.terminate_backends(database)),
        ):
            # Both return once the worker's connections are dead: a restart once the
            # server is back, a termination once the backends have exited.
            breaks()
            broken = time.monotonic()
            (run_id,) = insert_rows(pg, database, 1)
            wait_until(
                lambda: run_status(pg, database, run_id) == "succeeded",  # noqa: B023
                timeout=30,
                message=f"a run after the database {name}",
            )
            print(
                f"\nworker, database {name}: run succeeded {time.monotonic() - broken:.1f} s after"
            )
    finally:
        worker_code = worker.stop()
        relay_code = relay.stop()
    assert worker_code == 0, worker.log
    assert relay_code == 0, relay.log
