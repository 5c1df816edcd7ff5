"""Scenario 11: the PostgreSQL primary killed under load, or its machine vanished, and its
standby promoted.

A private primary with a streaming standby (``pg_basebackup -R``) that it waits for on every
commit (``synchronous_standby_names``, ``synchronous_commit = on``), from the moment the
standby streams. ``DATABASE_URL`` lists
both with ``target_session_attrs=read-write``, as a failover setup gives it. Jobs come
through the API; each is two messages for the broker and a run for the worker. The
primary is SIGKILLed (its clients' connections break at once), or its machine vanishes
(it runs behind a ``VanishingLink`` taken down: no reset, no answer, and the first host of
the URL never answers again); while nobody takes writes the API answers 503, never 500;
the standby is promoted, and the API, the relay, the worker, the monitor and the scheduler
all work on it within 15 s. A vanished primary's clients first wait for its connections to
be given up (``DB_DEAD_HOST_TIMEOUT``), and each new connection waits the connect timeout
on it until the process has met the promoted standby once. Synchronous replication is what
makes a 201 worth something here: every job whose POST was answered 201 is on the new
primary, and its messages are delivered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest

from tests.private_services import (
    HOST,
    PrivatePostgres,
    PrivateStandby,
    VanishingLink,
    VanishingPostgres,
)
from tests.reliability import tasks
from tests.reliability.support import (
    BrokerAudit,
    Database,
    Figures,
    JobTraffic,
    Stack,
    job_queues,
    migrate,
    scaled,
    seed,
    wait_for,
)

RATE = 20.0  # jobs per second over the client threads
NO_PRIMARY = scaled(3, 10)  # seconds between the kill and the promotion
# The bound: every daemon works on the new primary within this many seconds.
BACK_BOUND = 15.0
DATABASE = "hd_failover"


@pytest.fixture(params=["killed", "vanished"])
def replicated(request) -> Iterator[tuple[PrivatePostgres, PrivateStandby, Callable[[], None]]]:
    """A migrated primary and its synchronous standby, streaming, and how the primary fails."""
    settings = {"synchronous_commit": "on", "wal_level": "replica", "max_wal_senders": "5"}
    link = VanishingLink() if request.param == "vanished" else None
    primary = (
        PrivatePostgres(settings=settings)
        if link is None
        else VanishingPostgres(link, settings=settings)
    )
    standby = PrivateStandby(primary, name="standby")
    try:
        if link is not None:
            link.start()
        primary.start()
        primary.create_database(DATABASE)
        migrate(primary.url(DATABASE))
        primary.execute(tasks.TABLES, dbname=DATABASE)
        standby.start()
        wait_for(lambda: standby.streaming() is not None, timeout=60, what="the standby")
        # Synchronous only now: until a standby streams, every commit would wait for it.
        primary.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
        primary.execute("SELECT pg_reload_conf()")
        wait_for(lambda: standby.streaming() == "sync", timeout=60, what="the standby in sync")
        yield primary, standby, primary.kill if link is None else link.vanish
    finally:
        standby.close()
        primary.close()
        if link is not None:
            link.close()


def last_database_warning(stack: Stack, name: str) -> float | None:
    """When the daemon last said it could not reach the database (epoch seconds)."""
    lines = [
        line
        for line in (stack.logs / f"{name}.log").read_text(errors="replace").splitlines()
        if "database unreachable" in line
    ]
    if not lines:
        return None
    return datetime.strptime(lines[-1][:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.mark.timeout(scaled(300, 600))
def test_the_primary_killed_and_its_standby_promoted_loses_no_acknowledged_job(
    replicated, make_stack, figures
):
    primary, standby, fail = replicated
    url = (
        f"postgres://postgres@{primary.host}:{primary.port},{HOST}:{standby.port}/{DATABASE}"
        "?target_session_attrs=read-write"
    )
    vanished = isinstance(primary, VanishingPostgres)
    # A vanished primary's connections are given up after DB_DEAD_HOST_TIMEOUT (10 s), and a
    # new one then waits the connect timeout (5 s) on it to find only the standby, read-only:
    # the promotion comes after both, so that every client meets the outage, as after a kill.
    no_primary = NO_PRIMARY + (10 + 5 if vanished else 0)
    stack = make_stack(database_url=url, effect_subscribes=["JobCreated"])
    seeded = seed(stack)
    stack.api(workers=3)
    stack.relay()
    stack.wait_for_relay()
    stack.worker("--queues", "default", "--concurrency", "4")
    beats = {name: stack.logs / f"{name}.alive" for name in ("monitor", "scheduler")}
    stack.monitor(interval=1.0, LIVENESS_FILE=beats["monitor"])
    stack.start("scheduler", "run_scheduler", "--interval", "1", LIVENESS_FILE=beats["scheduler"])
    # Both past their first cycle before the kill: on a loaded machine a daemon still
    # starting would meet the new primary only, and the outage would be nobody's to see.
    wait_for(
        lambda: all(beat.exists() for beat in beats.values()),
        timeout=60,
        what=lambda: f"the monitor's and the scheduler's first cycle\n{stack.log_tail()}",
    )
    audit = BrokerAudit(stack.rabbitmq_url, job_queues(stack, seeded.automation_id)).start()
    traffic = JobTraffic(stack.api_url, seeded, threads=4, rate=RATE)
    try:
        traffic.start()
        wait_for(lambda: traffic.created >= 2 * RATE, timeout=60, what="traffic")
        fail()
        killed_at = time.monotonic()
        time.sleep(no_primary)
        refused_before = traffic.statuses[503]
        standby.promote()
        promoted_at, promoted_wall = time.monotonic(), time.time()
        # The test reads the new primary straight: a vanished first host in the URL would
        # cost each of its reads the connect timeout.
        stack.database = Database(standby.url(DATABASE))
        moment = stack.database.now()  # the new primary's clock
        wait_for(
            lambda: (traffic.last_created_at or 0) > promoted_at,
            timeout=60,
            what=lambda: f"the API to create jobs again\n{stack.log_tail('api')}",
        )
        api_back = traffic.last_created_at - promoted_at
        wait_for(
            lambda: stack.database.delivered_after(moment),
            timeout=60,
            what=lambda: f"the relay to deliver again\n{stack.log_tail('relay')}",
        )
        relay_back = time.monotonic() - promoted_at
        wait_for(
            lambda: stack.database.executed_after(moment),
            timeout=60,
            what=lambda: f"the worker to run again\n{stack.log_tail('worker')}",
        )
        worker_back = time.monotonic() - promoted_at
        # Long enough for the monitor and the scheduler (a cycle a second) to show it.
        time.sleep(max(0.0, BACK_BOUND + 3 - (time.monotonic() - promoted_at)))
        traffic.stop()
        created = traffic.job_ids
        found = stack.database.value("SELECT count(*) FROM jobs WHERE id = ANY(%s)", [created])
        expected = stack.database.job_created_run_ids(but="chaos.effect")
        audit.wait_for(
            expected,
            timeout=120,
            what=lambda: f"every JobCreated on the broker\n{stack.log_tail()}",
        )
        # Nothing due is left unsent. (A run the worker could not mark done while there was
        # no primary comes back later, by design: its row waits for its lease.)
        wait_for(
            lambda: stack.database.oldest_pending_age() < 2.0,
            timeout=30,
            what=lambda: f"nothing due left unsent\n{stack.database.pending_summary()}",
        )
        alive = {name: stack.alive(name) for name in ("relay", "worker", "monitor", "scheduler")}
        quiet_since = {
            name: last_database_warning(stack, name) for name in ("monitor", "scheduler")
        }
    finally:
        traffic.stop()
        audit.stop()
        stack.close()

    lost = expected - audit.seen
    daemons_back = {name: (at - promoted_wall if at else 0.0) for name, at in quiet_since.items()}
    figures(
        Figures(
            f"11 PostgreSQL failover ({'vanished' if vanished else 'killed'})",
            sent=len(expected),
            delivered=len(expected & audit.seen),
            duplicates=audit.duplicates(),
            lost=len(lost),
            recovery_seconds=max(api_back, relay_back, worker_back, *daemons_back.values()),
            extra={
                "jobs_201": len(created),
                "jobs_found": found,
                "no_primary_s": promoted_at - killed_at,
                "refused_503": traffic.statuses[503],
                "refused_503_before_promotion": refused_before,
                "api_back_s": api_back,
                "relay_back_s": relay_back,
                "worker_back_s": worker_back,
                "monitor_last_warning_s": daemons_back["monitor"],
                "scheduler_last_warning_s": daemons_back["scheduler"],
            },
        )
    )
    # 503 while nobody takes writes, never a 500 nor a dropped request.
    assert set(traffic.statuses) <= {201, 503}, traffic.failures[:5]
    assert traffic.statuses[503] > 0, "no request came while there was no primary"
    # Every job answered 201 is on the new primary: the standby had it before the 201.
    assert found == len(created)
    assert not lost
    assert all(alive.values()), alive
    assert api_back <= BACK_BOUND
    assert relay_back <= BACK_BOUND
    assert worker_back <= BACK_BOUND
    # The monitor and the scheduler met the outage, and had none of it past the bound.
    for name, since in daemons_back.items():
        assert quiet_since[name] is not None, f"{name} never noticed the outage"
        assert since <= BACK_BOUND, (name, since)
