"""A stopped worker is over: no thread of its own left running."""

from __future__ import annotations

import threading

import pytest

from tests.worker.conftest import dispatch_work, run_finished, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# The threads a task worker starts: its slots, the run window's claim and commit threads,
# the lease keeper, and on SQS a poller per queue.
WORKER_THREADS = ("task-", "runs-claim", "runs-done", "leases", "sqs-")


def its_threads(before: set[threading.Thread]) -> list[str]:
    return sorted(
        thread.name
        for thread in threading.enumerate()
        if thread not in before and thread.is_alive() and thread.name.startswith(WORKER_THREADS)
    )


def test_a_stopped_worker_leaves_none_of_its_threads_running(broker, relay, start_worker):
    before = set(threading.enumerate())
    worker = start_worker(concurrency=2)
    run_ids = [dispatch_work() for _ in range(3)]
    wait_for(lambda: all(run_finished(run_id) for run_id in run_ids), what="the runs")
    assert its_threads(before), "the worker's threads are found while it runs"

    worker.stop()

    # Each one ends at its next look (half a second), or when its long poll returns (SQS,
    # a second here): not 5 s after, when an idle lease keeper would end by itself, and
    # not never, as a run window's threads did.
    wait_for(lambda: not its_threads(before), timeout=3, what="the worker's threads to end")
