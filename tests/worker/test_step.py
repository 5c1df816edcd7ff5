"""The worker's step, called directly: one real delivery through the task processor, the
relay's one pass run inline (no thread), the worker wired by ``build_task_worker``."""

from __future__ import annotations

import pytest
from django.db import connection

from outbox.models import TaskRun
from relay.engine import OutboxRelay
from tests.worker.conftest import dispatch_work, executions, run_of, wait_for
from worker.builders import build_task_worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_step_takes_a_delivery_and_the_processor_settles_its_run(broker):
    relay = OutboxRelay()
    relay.transport.setup_topology()
    worker = build_task_worker(["default"], concurrency=1, stop_budget=5, poll_interval=0.05)
    assert worker.loop.start()
    try:
        # Nothing sent yet: a step finds nothing and says so.
        assert worker.loop.step(0.1) is False

        run_id = dispatch_work()
        assert relay.relay_one_batch() is False  # one row: not a full batch
        wait_for(lambda: worker.loop.step(0.5), what="a step that took the delivery")

        # Steps go on meanwhile: on RabbitMQ they also carry the settlement to the broker.
        wait_for(
            lambda: (worker.loop.step(0.05) or True) and worker.loop.in_flight == 0,
            what="the delivery to be settled",
        )
        assert run_of(run_id).status == TaskRun.Status.SUCCEEDED
        assert len(executions(run_id)) == 1
        assert worker.processor.outcomes["succeeded"] == 1
    finally:
        worker.loop.stop()
        stats = worker.loop.finish()
        relay.close()
        connection.close()
    assert stats.received == 1 and stats.given_back == 0
