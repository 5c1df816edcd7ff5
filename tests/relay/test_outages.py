"""``run_relay`` comes back by itself from any outage, idle or draining.

Each test breaks a private instance of the dependency (tests/private_services.py): its
own PostgreSQL cluster restarted or its backends terminated, its own RabbitMQ node stopped
or its connections closed, its own Redis stopped. The relay runs as the daemon it is, a
subprocess; the tests wait for positive signals (rows marked sent, messages in the queue)
and print the recovery times they measured.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pika.exceptions
import psycopg
import pytest
from django.db import transaction

from outbox.models import PlatformOutboxMessage
from outbox.services import dispatch
from tests.polling import wait_until
from tests.private_services import Daemon, private_environment
from tests.relay.conftest import RabbitConsumer, run_ids

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def daemons():
    started: list[Daemon] = []

    def start(env: dict[str, str]) -> Daemon:
        daemon = Daemon("run_relay", env=env)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def first_message(consumer: RabbitConsumer):
    """The hourly purge, due at the relay's first start (its queue declared first)."""
    wait_until(
        lambda: consumer.exists("maintenance"),
        timeout=30,
        message="the relay to declare its queues",
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            return consumer.take_one("maintenance", timeout=max(1.0, deadline - time.monotonic()))
        except pika.exceptions.AMQPError:
            # A quorum queue just declared on a loaded node may refuse a consumer for a
            # moment (541 INTERNAL_ERROR while its leader is elected): ask again.
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
            consumer.reconnect()


def relay_environment(settings, **kwargs) -> dict[str, str]:
    extra = {key: str(value) for key, value in kwargs.items() if key.isupper()}
    services = {key: value for key, value in kwargs.items() if not key.isupper()}
    return private_environment(
        settings, BROKER="rabbitmq", HUBDOMMED_RELAY="true", **services, **extra
    )


# -- PostgreSQL ----------------------------------------------------------------------------------


def insert_rows(pg, database: str, count: int) -> list[str]:
    """``count`` due platform rows on the private database (dispatch's envelope shape)."""
    rows = pg.execute(
        """
        INSERT INTO platform_outbox_messages (run_id, queue, envelope, available_at)
        SELECT r.run_id, 'maintenance',
               jsonb_build_object(
                   'version', 1, 'run_id', r.run_id::text, 'task', 'maintenance.purge',
                   'queue', 'maintenance', 'destination', 'maintenance', 'event', null,
                   'event_id', null, 'tenant', null, 'payload', jsonb_build_object('n', r.n),
                   'occurred_at', clock_timestamp()::text, 'correlation_id', 'outage'),
               clock_timestamp()
          FROM (SELECT n, gen_random_uuid() AS run_id
                  FROM generate_series(1, %(count)s) AS n) AS r
        RETURNING run_id::text
        """,
        {"count": count},
        dbname=database,
    )
    return [run_id for (run_id,) in rows]


def unsent(pg, database: str) -> int:
    try:
        return pg.execute(
            "SELECT count(*) FROM platform_outbox_messages WHERE sent_at IS NULL",
            dbname=database,
        )[0][0]
    except psycopg.OperationalError:
        return -1  # the database is restarting: not drained


def sent(pg, database: str) -> int:
    return pg.execute(
        "SELECT count(*) FROM platform_outbox_messages WHERE sent_at IS NOT NULL",
        dbname=database,
    )[0][0]


def passes_begun(liveness: Path, count: int = 2) -> None:
    """Until the relay has begun ``count`` more passes, so that all but the last have run to
    their end. Each pass beats the heartbeat as it begins, which touches the liveness file
    (at most once a second; idle passes are a sweep, 2 s, apart)."""

    def touched() -> int:
        with contextlib.suppress(FileNotFoundError):
            return liveness.stat().st_mtime_ns
        return 0

    for _ in range(count):
        before = touched()
        wait_until(lambda b=before: touched() != b, timeout=30, message="a pass of the relay")


def test_an_idle_relay_recovers_from_a_database_restart_and_from_terminated_backends(
    settings, private_postgres, migrated_database, rabbit, daemons, tmp_path
):
    pg, database = private_postgres, migrated_database
    liveness = tmp_path / "relay.alive"
    # The default sweep (2 s): each idle pass starts with the schedules, outside a transaction.
    relay = daemons(
        relay_environment(settings, postgres=pg, database=database, LIVENESS_FILE=liveness)
    )
    # The hourly purge, due at the first start: the relay is up, then idle.
    assert first_message(rabbit) is not None

    pg.restart("fast")
    restarted = time.monotonic()
    passes_begun(liveness)  # an idle pass runs into the dead connection before anything is due
    (after_restart,) = insert_rows(pg, database, 1)
    received = rabbit.take_run("maintenance", after_restart, timeout=20)
    assert received is not None, f"the relay never recovered from the restart:\n{relay.log}"
    print(f"\nidle relay, database restart: sent {time.monotonic() - restarted:.1f} s after it")

    assert pg.terminate_backends(database) >= 1
    terminated = time.monotonic()
    passes_begun(liveness)  # an idle pass on the dead connection
    (after_terminate,) = insert_rows(pg, database, 1)
    # A copy of the row before may come first: the kill may have come before its commit.
    received = rabbit.take_run("maintenance", after_terminate, timeout=20)
    assert received is not None, f"the relay never recovered its connection:\n{relay.log}"
    print(f"idle relay, backends terminated: sent {time.monotonic() - terminated:.1f} s after")

    assert relay.stop() == 0, relay.log
    assert "Traceback" not in relay.log, relay.log


def test_a_draining_relay_recovers_from_a_database_restart_and_terminated_backends(
    settings, private_postgres, migrated_database, rabbit, daemons
):
    pg, database = private_postgres, migrated_database
    relay = daemons(
        relay_environment(
            settings,
            postgres=pg,
            database=database,
            RELAY_SWEEP_INTERVAL=0.2,
            RELAY_BATCH_SIZE=25,
        )
    )
    assert first_message(rabbit) is not None
    expected: list[str] = []

    for name, breaks in (
        ("restart", lambda: pg.restart("fast")),
        ("backends terminated", lambda: pg.terminate_backends(database)),
    ):
        already = sent(pg, database)
        expected += insert_rows(pg, database, 3000)
        # Mid-drain: some batches sent, most not.
        wait_until(
            lambda: sent(pg, database) >= already + 100,  # noqa: B023
            timeout=30,
            message="the drain to start",
        )
        breaks()
        broken = time.monotonic()
        assert unsent(pg, database) > 0, "the backlog drained before the outage"
        wait_until(
            lambda: unsent(pg, database) == 0,
            timeout=60,
            message=f"the backlog to drain after {name}",
        )
        print(f"\ndraining relay, database {name}: drained {time.monotonic() - broken:.1f} s after")

    received = run_ids(env for _, env in rabbit.take_all("maintenance"))
    lost = set(expected) - set(received)
    duplicates = sum(received.values()) - len(received)
    print(
        f"sent={len(expected)} delivered={len(received)} duplicates={duplicates} lost={len(lost)}"
    )
    assert not lost
    assert relay.stop() == 0, relay.log


# -- the broker ---------------------------------------------------------------------------------


def test_after_a_broker_outage_the_backlog_drains_within_seconds_of_its_return(
    settings, running_private_rabbitmq, daemons
):
    node = running_private_rabbitmq
    # The test's commits wake the relay through Redis as the application's do.
    relay = daemons(relay_environment(settings, rabbitmq=node))
    consumer = RabbitConsumer(node.url)
    try:
        assert first_message(consumer) is not None
    finally:
        consumer.close()

    node.stop()
    stopped = time.monotonic()
    backlog = []
    # Rows keep coming during a ~20 s outage, each commit waking the relay.
    while time.monotonic() - stopped < 20:
        with transaction.atomic():
            backlog += [dispatch("maintenance.purge", {"n": n}) for n in range(10)]
        time.sleep(1)
    node.start()
    returned = time.monotonic()
    rows = PlatformOutboxMessage.objects.filter(run_id__in=backlog)
    wait_until(
        lambda: not rows.filter(sent_at__isnull=True).exists(),
        timeout=60,
        message="the backlog to drain",
    )
    recovery = time.monotonic() - returned
    print(
        f"\nbroker outage of {returned - stopped:.1f} s: backlog of {len(backlog)} drained "
        f"{recovery:.1f} s after the broker's return"
    )
    # Not a benchmark: the bound is the point (seconds, not the outage's length).
    assert recovery < 6, relay.log

    consumer = RabbitConsumer(node.url)
    try:
        received = run_ids(env for _, env in consumer.take_all("maintenance"))
    finally:
        consumer.close()
    assert set(received) >= {str(r) for r in backlog}
    assert relay.stop() == 0, relay.log


def test_an_idle_relay_whose_connection_the_broker_dropped_reconnects_with_one_warning(
    settings, running_private_rabbitmq, daemons
):
    node = running_private_rabbitmq
    relay = daemons(relay_environment(settings, rabbitmq=node))
    consumer = RabbitConsumer(node.url)
    try:
        assert first_message(consumer) is not None
        node.ctl("close_all_connections", "closed by the test")
        consumer.reconnect()  # closed by the broker too

        with transaction.atomic():
            run_id = dispatch("maintenance.purge", {"after": "close"})
        received = consumer.take_run("maintenance", run_id, timeout=20)
    finally:
        consumer.close()

    assert received is not None
    row = PlatformOutboxMessage.objects.get(run_id=run_id)
    assert row.attempts == 0, "sent at the first try"
    assert relay.stop() == 0, relay.log
    assert "Traceback" not in relay.log and " ERROR " not in relay.log, relay.log
    assert sum("reconnecting" in line for line in relay.lines) == 1, relay.log


def test_a_relay_waiting_out_a_broker_outage_stops_promptly_on_sigterm(
    settings, running_private_rabbitmq, daemons
):
    node = running_private_rabbitmq
    relay = daemons(relay_environment(settings, rabbitmq=node))
    consumer = RabbitConsumer(node.url)
    try:
        assert first_message(consumer) is not None
    finally:
        consumer.close()
    node.stop()
    with transaction.atomic():
        dispatch("maintenance.purge", {"during": "outage"})
    wait_until(
        lambda: "broker unreachable" in relay.log,
        timeout=20,
        message="the relay to notice the outage",
    )

    asked = time.monotonic()
    assert relay.stop(timeout=15) == 0, relay.log
    print(f"\nSIGTERM during a broker outage: exited in {time.monotonic() - asked:.1f} s")
    assert time.monotonic() - asked < 5
    node.start()


# -- Redis --------------------------------------------------------------------------------------


def liveness(path: Path) -> dict:
    """What the daemon's liveness file says (empty until it is first written)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def test_without_redis_the_relay_sweeps_and_it_returns_to_the_signal_when_redis_is_back(
    settings, private_redis, rabbit, daemons, tmp_path
):
    sweep = 4.0
    alive = tmp_path / "relay.alive"
    settings.REDIS_URL = private_redis.url  # the test's commits signal on the private Redis
    relay = daemons(
        relay_environment(
            settings, redis=private_redis, RELAY_SWEEP_INTERVAL=sweep, LIVENESS_FILE=alive
        )
    )
    assert first_message(rabbit) is not None

    # Idle when Redis goes: the sweep delivers. The relay finds Redis gone when its drain
    # (it may still be on the first one) ends and it waits for the signal again.
    private_redis.stop()
    wait_until(
        lambda: "Redis unreachable" in relay.log,
        timeout=sweep * 2,
        message="the relay to find Redis gone",
    )
    with transaction.atomic():
        idle_row = dispatch("maintenance.purge", {"redis": "down, idle"})
    received = rabbit.take_run("maintenance", idle_row, timeout=sweep * 3)
    assert received is not None
    # Alive, and degraded: what a container's health check prints, never a restart.
    wait_until(
        lambda: (
            "sweeping the outbox every 4 s"
            in liveness(alive).get("degraded", {}).get("redis", {}).get("detail", "")
        ),
        timeout=sweep * 2,
        message=lambda: f"the liveness file to say Redis is degraded: {liveness(alive)}",
    )
    assert liveness(alive)["status"] == "degraded"

    # Draining when Redis is away: the backlog goes, without a signal.
    with transaction.atomic():
        backlog = [dispatch("maintenance.purge", {"n": n}) for n in range(300)]
    rows = PlatformOutboxMessage.objects.filter(run_id__in=backlog)
    wait_until(
        lambda: not rows.filter(sent_at__isnull=True).exists(),
        timeout=30,
        message="the sweep to drain",
    )

    private_redis.start()
    wait_until(
        lambda: "Redis reachable again" in relay.log,
        timeout=sweep * 3,
        message="the relay to see Redis",
    )
    wait_until(
        lambda: liveness(alive).get("status") == "ok",
        timeout=sweep * 2,
        message=lambda: f"the liveness file to say ok again: {liveness(alive)}",
    )
    rabbit.take_all("maintenance")
    with transaction.atomic():
        woken = dispatch("maintenance.purge", {"redis": "back"})
    committed = time.monotonic()
    received = rabbit.take_run("maintenance", woken, timeout=sweep * 3)
    assert received is not None
    # Woken by the signal again, not by the next sweep.
    assert time.monotonic() - committed < sweep * 0.75, relay.log
    assert relay.stop() == 0, relay.log
