"""A daemon asked to stop while what it waits on hangs mid-answer (PostgreSQL, RabbitMQ:
the host still acknowledges every packet, nothing comes back) still ends within its bound,
and says where it was blocked: before, it waited for the hang to end, whatever the signal
said, until an orchestrator's kill ended it in silence."""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection

from tests.polling import wait_until
from tests.private_services import Daemon
from tests.processes import process_environment, wait_until_it_handles
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def stopped_within(daemon: Daemon, seconds: float) -> float:
    """SIGTERM, then how long the process took to end (failing past ``seconds``)."""
    wait_until_it_handles(daemon.process, signal.SIGTERM, timeout=60)
    asked = time.monotonic()
    daemon.process.send_signal(signal.SIGTERM)
    wait_until(lambda: daemon.process.poll() is not None, timeout=seconds, message=daemon.log)
    return time.monotonic() - asked


def test_the_scheduler_ends_its_stop_in_time_when_the_database_hangs(settings):
    db = settings.DATABASES["default"]
    with TcpProxy(int(db["PORT"] or 5432), target_host=db["HOST"]) as proxy:
        env = process_environment(
            settings,
            DATABASE_URL=f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}",
            DAEMON_STOP_SECONDS="2",
            LOG_LEVEL="info",
        )
        scheduler = Daemon("run_scheduler", "--interval", "0.2", env=env)
        try:
            scheduler.wait_for_line("scheduler starting", 30)
            proxy.freeze()
            # Its next cycle's statement is sent, and hangs.
            wait_until(lambda: proxy.held, timeout=20, message=lambda: scheduler.log)
            took = stopped_within(scheduler, 20)
        finally:
            proxy.thaw()
            scheduler.stop()
    connection.close()

    assert scheduler.process.returncode == 1
    assert took < 2 + 5, took
    line = scheduler.wait_for_line("after the stop", 5)
    assert "still running 2 s after the stop, in " in line and "ERROR" in line


def test_the_worker_ends_its_stop_in_time_when_the_broker_hangs(settings):
    from urllib.parse import urlsplit

    broker = urlsplit(settings.RABBITMQ_URL.split(",")[0])
    with TcpProxy(broker.port or 5672, target_host=broker.hostname) as proxy:
        env = process_environment(
            settings,
            BROKER="rabbitmq",
            RABBITMQ_URL=f"amqp://{broker.username}:{broker.password}@127.0.0.1:{proxy.port}/%2F",
            WORKER_STOP_BUDGET="2",
            LOG_LEVEL="info",
        )
        worker = Daemon("run_worker", "--queues", "maintenance", "--concurrency", "1", env=env)
        try:
            worker.wait_for_line("consuming", 30)
            proxy.freeze()
            took = stopped_within(worker, 40)
        finally:
            proxy.thaw()
            worker.stop()

    assert took < 2 + 5 + 5, took
    assert "after the stop, in " in worker.wait_for_line("after the stop", 5)
