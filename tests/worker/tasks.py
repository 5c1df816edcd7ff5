"""Test-only task handlers (catalogued in the tests' own tasks catalog, never tasks.json).

``test.work`` (and ``test.work.<queue>``, the same on the other queue classes) records
each execution in Redis (by run_id) and then does what its payload says: sleep, wait for
the test's go-ahead, fail transiently until a given receive, or fail permanently.
``test.limited`` has a time limit of one second.
"""

from __future__ import annotations

import time

import redis
from django.conf import settings

from common.errors import InvalidInput
from outbox.handlers import TaskMessage, task
from tests.polling import WaitTimedOut, wait_until


class TransientProblem(Exception):
    """Something that may well work next time (a timeout, say)."""


def executions_key(run_id) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:worker-test:executions:{run_id}"


def go_ahead_key(run_id) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:worker-test:go-ahead:{run_id}"


def wait_for_go_ahead(message: TaskMessage, timeout: float = 20.0) -> None:
    """Hold the run until the test says so (a key in Redis), so that what the test does
    meanwhile surely happens while the task runs."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        wait_until(
            lambda: client.exists(go_ahead_key(message.run_id)),
            timeout=timeout,
            message="the go-ahead",
        )
    except WaitTimedOut:
        raise TransientProblem("no go-ahead came") from None
    finally:
        client.close()


def record_execution(message: TaskMessage) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        key = executions_key(message.run_id)
        client.rpush(key, f"{message.receive_count}:{time.time()}")
        client.expire(key, 3600)
    finally:
        client.close()


@task("test.work")
@task("test.work.critical")
@task("test.work.bulk")
@task("test.work.maintenance")
def work(message: TaskMessage) -> None:
    payload = message.payload
    record_execution(message)
    if payload.get("permanent"):
        raise InvalidInput("the payload can never be processed")
    if message.receive_count == 1 and payload.get("sleep_on_first"):
        time.sleep(payload["sleep_on_first"])
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("wait_for_go_ahead"):
        wait_for_go_ahead(message)
    if message.receive_count < payload.get("succeed_on", 1):
        raise TransientProblem(f"not yet (receive {message.receive_count})")


@task("test.limited")
def limited(message: TaskMessage) -> None:
    """Stuck past its task's time limit on its first receive (it sleeps ``first_sleep``
    seconds, then returns as if it had succeeded); refused for good on later receives."""
    record_execution(message)
    if message.receive_count == 1:
        time.sleep(message.payload["first_sleep"])
        return
    raise InvalidInput("refused on a later receive")
