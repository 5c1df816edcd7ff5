"""Long tasks keep their message; duplicates run once; killed workers lose nothing."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from outbox.models import PlatformOutboxMessage, TaskRun
from tests.processes import wait_until_it_handles
from tests.worker.conftest import (
    dispatch_work,
    executions,
    run_finished,
    run_of,
    wait_for,
    worker_command,
    worker_environment,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_task_longer_than_the_visibility_timeout_runs_once(broker, relay, start_worker):
    # Visibility 2 s (SQS) and a 2 s connection heartbeat (RabbitMQ): the task takes 5 s.
    worker = start_worker(concurrency=1)
    run_id = dispatch_work(sleep=5)

    wait_for(lambda: run_finished(run_id), what="the run to finish")
    # A message sent after it is handled too, and every delivery is settled: a copy the
    # broker sent while the task ran past its visibility timeout was in the queue before
    # that message, so it would have been received and counted by then.
    later = dispatch_work()
    wait_for(lambda: run_finished(later), what="a later message")
    wait_for(
        lambda: worker.processor.outcomes.total() == worker.worker.stats.received,
        what="every delivery settled",
    )

    assert worker.processor.outcomes == {"succeeded": 2}
    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert run.receive_count == 1
    assert len(executions(run_id)) == 1


def test_the_same_message_delivered_twice_runs_the_handler_once(broker, relay, start_worker):
    worker = start_worker()
    run_id = dispatch_work()
    wait_for(lambda: run_finished(run_id), what="the first delivery")
    # The relay sends the same row again (as after a crash between send and commit).
    PlatformOutboxMessage.objects.filter(run_id=run_id).update(sent_at=None)
    wait_for(
        lambda: PlatformOutboxMessage.objects.get(run_id=run_id).sent_at is not None,
        what="the second delivery",
    )
    # The worker receives the copy and acknowledges it without running it.
    wait_for(lambda: worker.processor.outcomes["duplicate"] == 1, what="the copy settled")

    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert run.receive_count == 1
    assert len(executions(run_id)) == 1


def test_a_worker_killed_mid_task_has_its_message_delivered_again_and_the_run_completes(
    broker, relay, start_worker
):
    process = subprocess.Popen(
        worker_command("--queues", "default", "--concurrency", "1"),
        env=worker_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        run_id = dispatch_work(sleep_on_first=60)
        wait_for(lambda: executions(run_id), what="the task to start in the subprocess")
        assert run_of(run_id).status == TaskRun.Status.RUNNING
        process.kill()
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
        process.stderr.close()

    start_worker(concurrency=1)
    wait_for(lambda: run_finished(run_id), what="the run to complete after the kill")

    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert run.receive_count == 2
    assert [count for count, _ in executions(run_id)] == [1, 2]


def _run_worker_then_sigterm(payload: dict, *, budget: float, tmp_path):
    ready_file = tmp_path / "worker.ready"
    process = subprocess.Popen(
        worker_command("--queues", "default", "--concurrency", "1"),
        env=worker_environment(WORKER_STOP_BUDGET=budget, WORKER_READY_FILE=ready_file),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(ready_file.exists, what="the readiness file")
        run_id = dispatch_work(**payload)
        wait_for(lambda: executions(run_id), what="the task to start in the subprocess")
        wait_until_it_handles(process, signal.SIGTERM)
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: not ready_file.exists(), timeout=5, what="the worker to report not ready")
        stdout, stderr = process.communicate(timeout=budget + 20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return run_id, process.returncode, stdout, stderr


def test_sigterm_during_a_task_lets_it_finish_within_the_stop_budget(broker, relay, tmp_path):
    run_id, code, stdout, stderr = _run_worker_then_sigterm(
        {"sleep": 2}, budget=15, tmp_path=tmp_path
    )

    assert code == 0, stderr
    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert len(executions(run_id)) == 1
    assert "given back" in stdout


def test_sigterm_during_a_task_longer_than_the_budget_returns_its_message_with_the_run_queued(
    broker, relay, start_worker, tmp_path
):
    run_id, code, _, stderr = _run_worker_then_sigterm(
        {"sleep_on_first": 60}, budget=1, tmp_path=tmp_path
    )

    assert code == 0, stderr
    assert run_of(run_id).status == TaskRun.Status.QUEUED
    # The message is back in its queue: the next worker completes the run.
    start_worker(concurrency=1)
    wait_for(lambda: run_finished(run_id), what="the run to complete after the return")
    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert [count for count, _ in executions(run_id)] == [1, 2]


def test_a_second_sigterm_exits_at_once(broker, relay, tmp_path):
    ready_file = tmp_path / "worker.ready"
    process = subprocess.Popen(
        worker_command("--queues", "default", "--concurrency", "1"),
        env=worker_environment(WORKER_STOP_BUDGET=60, WORKER_READY_FILE=ready_file),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(ready_file.exists, what="the readiness file")
        run_id = dispatch_work(sleep_on_first=60)
        wait_for(lambda: executions(run_id), what="the task to start in the subprocess")
        wait_until_it_handles(process, signal.SIGTERM)
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: not ready_file.exists(), timeout=5, what="not ready")
        process.send_signal(signal.SIGTERM)
        # Well under the 60 s budget.
        assert process.wait(timeout=10) != 0
    finally:
        if process.poll() is None:
            process.kill()


def test_sigterm_with_four_stuck_handlers_exits_within_one_stop_budget(broker, relay, tmp_path):
    budget = 2.0
    ready_file = tmp_path / "worker.ready"
    process = subprocess.Popen(
        worker_command("--queues", "default", "--concurrency", "4"),
        env=worker_environment(WORKER_STOP_BUDGET=budget, WORKER_READY_FILE=ready_file),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(ready_file.exists, what="the readiness file")
        run_ids = [dispatch_work(sleep_on_first=60) for _ in range(4)]
        wait_for(lambda: all(executions(r) for r in run_ids), what="four handlers stuck")
        wait_until_it_handles(process, signal.SIGTERM)
        asked = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=budget + 20)
        took = time.monotonic() - asked
    finally:
        if process.poll() is None:
            process.kill()
        _, stderr = process.communicate()

    assert process.returncode == 0, stderr
    print(f"\nSIGTERM with 4 stuck handlers, budget {budget:g} s: exited in {took:.2f} s")
    # One deadline for the whole stop, not the budget plus a wait per stuck thread (which
    # would take four budgets and more). Slack for a loaded machine, not for that.
    assert took < budget * 3, stderr
    assert {run_of(r).status for r in run_ids} == {TaskRun.Status.QUEUED}
