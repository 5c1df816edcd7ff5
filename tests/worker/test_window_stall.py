"""A task worker whose database stops answering in the middle of its window's claim (the
host still acknowledging every packet) stops its signs of life, so its health check fails,
and says so once; before, its consume loop kept the liveness file fresh while no run
moved. The beats, and the run, come back when the database answers again."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from django.db import transaction

from outbox.models import TaskRun
from outbox.services import dispatch
from tests.polling import wait_until
from tests.private_services import Daemon
from tests.processes import database_sessions, process_environment
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def age(path) -> float:
    return time.time() - os.stat(path).st_mtime


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_a_claim_with_no_answer_stops_the_workers_signs_of_life(broker, relay, settings, tmp_path):
    db = settings.DATABASES["default"]
    liveness = tmp_path / "worker.alive"
    # The worker's sessions, told apart from any other test's on this database.
    name = f"window-stall-{uuid.uuid4().hex[:8]}"
    with TcpProxy(int(db["PORT"] or 5432), target_host=db["HOST"]) as proxy:
        env = process_environment(
            settings,
            PGAPPNAME=name,
            BROKER="rabbitmq",
            DATABASE_URL=f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}",
            LIVENESS_FILE=str(liveness),
            WORKER_STALL_SECONDS="2",
            LOG_LEVEL="info",
        )
        worker = Daemon("run_worker", "--queues", "maintenance", "--concurrency", "1", env=env)
        try:
            worker.wait_for_line("consuming", 30)
            wait_until(lambda: liveness.exists() and age(liveness) < 1.5, timeout=10)
            proxy.freeze()
            with transaction.atomic():
                run_id = dispatch("maintenance.purge", {})
            worker.wait_for_line("no more signs of life", 30)
            wait_until(lambda: age(liveness) > 3, timeout=10, message=worker.log)
            proxy.thaw()
            wait_until(
                lambda: TaskRun.objects.get(run_id=run_id).status == "succeeded",
                timeout=60,
                message=lambda: worker.log,
            )
            wait_until(lambda: age(liveness) < 1.5, timeout=10, message=worker.log)
        finally:
            proxy.thaw()
            worker.stop()
    # The worker's sessions end as the proxy's sockets close: gone before the test database
    # is dropped (it refuses while a session is open).
    wait_until(lambda: database_sessions(name) == 0, timeout=60, message="sessions still open")
    assert "bookkeeping moves again" in worker.log
