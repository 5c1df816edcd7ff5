"""Scenario 10: a RabbitMQ cluster of three loses nodes while jobs flow.

A private cluster (three nodes on their own ports, joined, an Erlang cookie of its own);
``RABBITMQ_URL`` lists the three nodes, so the relay and the worker connect to the first.
Jobs come through the API; each one's ``JobCreated`` is two messages on the broker
(power-on and the automation's queue, counted by a consumer on the last node) and a run
of ``chaos.effect`` that the worker settles. The node the relay and the worker are
connected to is SIGKILLed: both move to another node within seconds, nothing is lost, the
copies are no more than the relay's in-doubt window (one batch published and not yet
confirmed). Then every node is killed and restarted in turn, a rolling restart, under the
same traffic: nothing lost.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.private_services import PrivateRabbitMQCluster
from tests.reliability import tasks
from tests.reliability.support import (
    BrokerAudit,
    Figures,
    JobTraffic,
    Stack,
    job_queues,
    scaled,
    seed,
    wait_for,
)

JOBS = scaled(600, 10_000)
RATE = scaled(40.0, 100.0)  # jobs per second over the client threads
ROLLING_RATE = scaled(20.0, 100.0)
BATCH = 200  # the relay's batch: what it may have published and not yet seen confirmed
# The bound: delivery resumes on another node within this many seconds.
RESUME_BOUND = 10.0
CONCURRENCY = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[PrivateRabbitMQCluster]:
    nodes = PrivateRabbitMQCluster(tmp_path_factory.mktemp("cluster"))
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.close()


def cluster_stack(make_stack, database_url: str, cluster: PrivateRabbitMQCluster):
    """The API, the relay and a worker on the cluster (first node first), a consumer of
    the jobs' queues on the last node, and the effects' tables."""
    cluster.start()  # a node an earlier test left down comes back
    stack: Stack = make_stack(
        database_url=database_url,
        rabbitmq_url=cluster.url,
        effect_subscribes=["JobCreated"],
    )
    stack.database.execute(tasks.TABLES)
    seeded = seed(stack)
    stack.api(workers=3)
    stack.relay(RELAY_BATCH_SIZE=str(BATCH))
    stack.wait_for_relay()
    stack.worker("--queues", "default", "--concurrency", str(CONCURRENCY))
    audit = BrokerAudit(
        cluster.url_from(len(cluster.nodes) - 1), job_queues(stack, seeded.automation_id)
    )
    return stack, seeded, audit.start()


def resumed(stack: Stack, moment: object, killed_at: float) -> tuple[float, float]:
    """Seconds from the kill until the relay delivered, and the worker ran, work that came
    after it."""
    wait_for(
        lambda: stack.database.delivered_after(moment),
        timeout=90,
        what=lambda: f"the relay to deliver again\n{stack.log_tail('relay')}",
    )
    relay = time.monotonic() - killed_at
    wait_for(
        lambda: stack.database.executed_after(moment),
        timeout=90,
        what=lambda: f"the worker to run again\n{stack.log_tail('worker')}",
    )
    return relay, time.monotonic() - killed_at


def settle(
    stack: Stack, audit: BrokerAudit, cluster: PrivateRabbitMQCluster, jobs: int
) -> set[str]:
    """Until every JobCreated is on the broker, no outbox row is pending and every job's
    run has succeeded; the expected run ids."""
    # The worker takes the runs of chaos.effect; the consumer counts the other two.
    expected = stack.database.job_created_run_ids(but="chaos.effect")
    try:
        audit.wait_for(expected, timeout=180, what="every JobCreated on the broker")
    except AssertionError as exc:
        missing = sorted(expected - audit.seen)
        raise AssertionError(
            f"{exc}: {len(missing)} missing, e.g. {missing[:3]};"
            f" {audit.cancellations} consumer cancellations; queues:"
            f" {cluster.queue_depths(stack.queue_prefix)}\n{stack.log_tail()}"
        ) from exc
    wait_for(lambda: stack.database.pending_rows() == 0, timeout=60, what="no pending row")
    wait_for(
        lambda: (
            stack.database.value(
                "SELECT count(*) FROM task_runs"
                " WHERE task = 'chaos.effect' AND status = 'succeeded'"
            )
            == jobs
        ),
        timeout=180,
        what=lambda: f"every job's run settled\n{stack.log_tail('worker')}",
    )
    return expected


def effects(stack: Stack) -> tuple[int, int]:
    """How many runs applied their effect, and the most times one did."""
    count, most = stack.database.rows(
        "SELECT count(*), coalesce(max(applications), 0) FROM reliability_effects"
    )[0]
    return count, most


def members(cluster: PrivateRabbitMQCluster, stack: Stack) -> set[int]:
    """How many members each of the scenario's quorum queues has."""
    return {len(m) for m, _online in cluster.queue_members(stack.queue_prefix).values()}


@pytest.mark.timeout(scaled(420, 1800))
def test_the_node_relay_and_worker_use_killed_under_load_loses_nothing(
    scenario_database, make_stack, cluster, figures
):
    stack, seeded, audit = cluster_stack(make_stack, scenario_database, cluster)
    traffic = JobTraffic(stack.api_url, seeded, threads=4, rate=RATE, total=JOBS)
    try:
        traffic.start()
        wait_for(lambda: traffic.created >= JOBS // 3, timeout=120, what="traffic")
        # Nothing slow between here and the kill (rabbitmqctl takes seconds on a loaded
        # machine, long enough for the traffic to end before it): jobs come after the kill.
        moment, killed_at = stack.database.now(), time.monotonic()
        cluster.nodes[0].kill()
        created_at_kill = traffic.created
        assert created_at_kill < JOBS, "the traffic was over before the kill"
        relay_resume, worker_resume = resumed(stack, moment, killed_at)
        # The queues are replicated on every node: the quorum the cluster allows.
        replicas = members(cluster, stack)
        traffic.join(timeout=scaled(300, 1500))
        expected = settle(stack, audit, cluster, JOBS)
        applied, most = effects(stack)
        # No row waited longer than the resumption: the relay does not go on publishing
        # on a channel the broker goes on refusing, backing its rows off further each time.
        lag_max = stack.database.value(
            "SELECT extract(epoch FROM max(sent_at - created_at))::float FROM outbox_messages"
        )
        relay_log = (stack.logs / "relay.log").read_text()
    finally:
        traffic.stop()
        audit.stop()
        stack.close()

    lost = expected - audit.seen
    figures(
        Figures(
            "10 cluster node SIGKILL",
            sent=len(expected),
            delivered=len(expected & audit.seen),
            duplicates=audit.duplicates(),
            lost=len(lost),
            recovery_seconds=max(relay_resume, worker_resume),
            extra={
                "jobs": JOBS,
                "relay_resumed_s": relay_resume,
                "worker_resumed_s": worker_resume,
                "redelivered_by_broker": audit.redelivered,
                "effects": applied,
                "delivery_lag_max_s": lag_max,
            },
        )
    )
    assert replicas == {len(cluster.nodes)}, replicas
    assert traffic.statuses == {201: JOBS}, traffic.failures[:5]
    assert len(expected) == 2 * JOBS
    assert not lost
    assert f"RabbitMQ node 127.0.0.1:{cluster.nodes[0].port} unavailable" in relay_log
    assert relay_resume <= RESUME_BOUND
    assert worker_resume <= RESUME_BOUND
    assert lag_max <= RESUME_BOUND + 2.0
    # Only what was published and not yet confirmed when the node died is sent again.
    assert audit.duplicates() <= BATCH
    assert (applied, most) == (JOBS, 1)


@pytest.mark.timeout(scaled(600, 2400))
def test_a_rolling_restart_under_load_loses_nothing(
    scenario_database, make_stack, cluster, figures
):
    stack, seeded, audit = cluster_stack(make_stack, scenario_database, cluster)
    traffic = JobTraffic(stack.api_url, seeded, threads=4, rate=ROLLING_RATE)
    resumes: list[float] = []
    try:
        traffic.start()
        wait_for(lambda: traffic.created >= 2 * ROLLING_RATE, timeout=60, what="traffic")
        for node in cluster.nodes:
            # The next node goes only once every queue has all its members again.
            cluster.wait_until_queues_whole(stack.queue_prefix)
            moment, killed_at = stack.database.now(), time.monotonic()
            node.kill()
            wait_for(
                lambda moment=moment: stack.database.delivered_after(moment),
                timeout=90,
                what=lambda: f"the relay to deliver again\n{stack.log_tail('relay')}",
            )
            resumes.append(time.monotonic() - killed_at)
            node.start()
            cluster.wait_until_all_running()
        cluster.wait_until_queues_whole(stack.queue_prefix)
        traffic.stop()
        jobs = traffic.created
        expected = settle(stack, audit, cluster, jobs)
        applied, most = effects(stack)
    finally:
        traffic.stop()
        audit.stop()
        stack.close()

    lost = expected - audit.seen
    figures(
        Figures(
            "10b cluster rolling restart",
            sent=len(expected),
            delivered=len(expected & audit.seen),
            duplicates=audit.duplicates(),
            lost=len(lost),
            recovery_seconds=max(resumes),
            extra={
                "jobs": jobs,
                "kills": len(resumes),
                "resumes_s": resumes,
                "redelivered_by_broker": audit.redelivered,
            },
        )
    )
    assert traffic.statuses == {201: traffic.sent}, traffic.failures[:5]
    assert len(expected) == 2 * jobs
    assert not lost
    assert len(resumes) == len(cluster.nodes)
    assert audit.duplicates() <= len(resumes) * BATCH
    assert (applied, most) == (jobs, 1)
