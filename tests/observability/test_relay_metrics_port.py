"""The relay's metrics port reports the outbox backlog, and keeps answering while the
database is away (without the backlog, said once in the log), and reports it again after."""

from __future__ import annotations

import contextlib

import pytest
import requests

from tests.observability.conftest import samples
from tests.polling import wait_until
from tests.ports import free_port
from tests.private_services import Daemon, private_environment

pytestmark = pytest.mark.slow

PENDING = ("hubdommed_outbox_pending_messages", frozenset({("table", "platform_outbox_messages")}))
OLDEST = (
    "hubdommed_outbox_oldest_due_age_seconds",
    frozenset({("table", "platform_outbox_messages")}),
)


def scrape(port: int) -> dict | None:
    with contextlib.suppress(requests.ConnectionError):
        return samples(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
    return None


def test_the_relay_reports_the_backlog_and_outlives_a_database_outage(
    settings, private_postgres, migrated_database
):
    pg, database = private_postgres, migrated_database
    # Late rows: due 30 s ago, and no broker to take them (a closed port), so they stay.
    for _ in range(3):
        pg.execute(
            "INSERT INTO platform_outbox_messages (run_id, queue, envelope, available_at)"
            " VALUES (gen_random_uuid(), 'default', '{\"task\": \"t\"}',"
            " now() - interval '30 seconds')",
            dbname=database,
        )
    port = free_port()
    relay = Daemon(
        "run_relay",
        env=private_environment(
            settings,
            postgres=pg,
            database=database,
            HUBDOMMED_RELAY="true",
            BROKER="rabbitmq",
            RABBITMQ_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F",
            METRICS_PORT=str(port),
        ),
    )
    try:

        def unsent() -> int:
            # Ours, and whatever the relay's schedule check enqueued meanwhile.
            return pg.execute(
                "SELECT count(*) FROM platform_outbox_messages WHERE sent_at IS NULL",
                dbname=database,
            )[0][0]

        up = wait_until(
            lambda: (s := scrape(port)) and s.get(PENDING) == unsent() and s,
            timeout=60,
            message=lambda: relay.log,
        )
        assert up[PENDING] >= 3
        assert up[OLDEST] >= 30

        pg.stop()
        during = [wait_until(lambda: scrape(port), timeout=30) for _ in range(3)]
        assert all(PENDING not in figures for figures in during)
        assert relay.process.poll() is None, relay.log
        relay.wait_for_line("outbox backlog not measured", timeout=10)

        pg.start()
        wait_until(lambda: (s := scrape(port)) and s.get(PENDING) == unsent() >= 3, timeout=30)
        assert sum("outbox backlog not measured" in line for line in relay.lines) == 1
    finally:
        code = relay.stop()
    assert code == 0, relay.log
