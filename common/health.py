"""Liveness and readiness probes.

``/health/live`` says the process serves requests. ``/health/ready`` checks each
dependency the API needs to do useful work and names the one that failed (only its name:
the reason goes to the log, not to whoever asks), so an operator reading a 503 knows
where to look. Redis is only an accelerator: without it the answer is a 200 whose status
is ``degraded`` and names it.

Readiness is asked often (every few seconds by each orchestrator, load balancer and
monitor) and matters most when the machine is busy, so it is made cheap and hard to fool:

- the checks run at the same time, each bounded by its own budget
  (``HEALTH_READY_BUDGET``), so one slow dependency does not eat another's time;
- an attempt that fails or is slow (``HEALTH_CHECK_TIMEOUT``) is tried again within the
  budget: one slow answer under load is not an outage;
- a success is remembered for ``HEALTH_READY_CACHE_SECONDS``, and the requests that ask
  at the same time share one check of each dependency: a burst of probes opens one broker
  connection, not one each. A failure is never remembered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

logger = logging.getLogger("hubdommed.health")

# Pause between two attempts of one check, and the most attempts within its budget.
RETRY_PAUSE = 0.2
MAX_ATTEMPTS = 3


def check_postgres(timeout: float) -> None:
    # Django's connection of this thread (the request's): already open, usually, and
    # bounded by the database's connect timeout rather than this one.
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def check_redis(timeout: float) -> None:
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_connect_timeout=timeout, socket_timeout=timeout
    )
    try:
        client.ping()
    finally:
        client.close()


def check_broker(timeout: float) -> None:
    # The same connection settings as the relay's, with the probe's timeouts.
    if settings.BROKER == "rabbitmq":
        from broker.rabbitmq.connection import blocking_connection, every_node_parameters

        # Ready while one node of the list answers (a cluster that lost one is still up).
        nodes = every_node_parameters()
        for params in nodes:
            params.socket_timeout = params.stack_timeout = timeout
            params.blocked_connection_timeout = timeout
        blocking_connection(nodes).close()
    else:
        from broker.sqs.publisher import sqs_client

        client = sqs_client(timeout=timeout, attempts=1)
        client.list_queues(QueueNamePrefix=settings.QUEUE_PREFIX, MaxResults=1)


def _broker_address() -> Hashable:
    if settings.BROKER == "rabbitmq":
        return ("rabbitmq", settings.RABBITMQ_URL)
    return ("sqs", settings.SQS_ENDPOINT_URL, settings.AWS_REGION, settings.QUEUE_PREFIX)


# Checked away from the request, at the same time: name -> (check, what it talks to).
# A remembered success is one of that address: pointing the setting elsewhere checks again.
REMOTE_CHECKS: dict[str, tuple[Callable[[float], None], Callable[[], Hashable]]] = {
    "redis": (check_redis, lambda: settings.REDIS_URL),
    "broker": (check_broker, _broker_address),
}

# What the API serves without (Redis: the wake signals and login throttles have their
# fallbacks): down or hung, it is a degraded detail of a 200, never a 503 that would take
# every replica out of service.
ACCELERATORS = frozenset({"redis"})

_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="readiness")
_lock = threading.Lock()
_in_flight: dict[tuple[str, Hashable], Future] = {}
_succeeded_at: dict[tuple[str, Hashable], float] = {}


def forget() -> None:
    """Drop the remembered successes (tests; a process that wants a fresh answer)."""
    with _lock:
        _succeeded_at.clear()


def _attempts(name: str, check: Callable[[float], None], *, on_failure=None) -> None:
    """``check`` until it succeeds, up to ``MAX_ATTEMPTS`` within the budget; else its error."""
    deadline = time.monotonic() + settings.HEALTH_READY_BUDGET
    attempt = 0
    while True:
        attempt += 1
        remaining = deadline - time.monotonic()
        try:
            check(min(settings.HEALTH_CHECK_TIMEOUT, max(remaining, 0.05)))
            if attempt > 1:
                logger.info("readiness check %s succeeded at attempt %d", name, attempt)
            return
        except Exception as exc:
            if on_failure is not None:
                on_failure()
            remaining = deadline - time.monotonic()
            if attempt >= MAX_ATTEMPTS or remaining <= RETRY_PAUSE:
                raise
            logger.info("readiness check %s attempt %d failed (%s); again", name, attempt, exc)
            time.sleep(RETRY_PAUSE)


def _remote_check(name: str) -> Future:
    """The outcome of ``name``'s check: remembered, in flight, or started now."""
    check, address = REMOTE_CHECKS[name]
    key = (name, address())
    with _lock:
        succeeded_at = _succeeded_at.get(key)
        if (
            succeeded_at is not None
            and time.monotonic() - succeeded_at < settings.HEALTH_READY_CACHE_SECONDS
        ):
            done: Future = Future()
            done.set_result(None)
            return done
        future = _in_flight.get(key)
        started = future is None
        if started:
            future = _executor.submit(_attempts, name, check)
            _in_flight[key] = future
    if started:
        # Outside the lock: a check that already ended runs this at once, in this thread,
        # and _settle takes the lock.
        future.add_done_callback(lambda finished: _settle(key, finished))
    return future


def _settle(key: tuple[str, Hashable], future: Future) -> None:
    with _lock:
        if _in_flight.get(key) is future:
            del _in_flight[key]
        if not future.cancelled() and future.exception() is None:
            _succeeded_at[key] = time.monotonic()


# GET only, and no CSRF check: another method is a 405, not a 403 for a missing token.
@csrf_exempt
@require_GET
def live(request):
    return JsonResponse({"status": "ok"})


@csrf_exempt
@require_GET
def ready(request):
    started = time.monotonic()
    remote = {name: _remote_check(name) for name in REMOTE_CHECKS}
    errors: dict[str, BaseException | None] = {}
    try:
        # In the request's thread, with its connection; closed after a failure so that the
        # next attempt connects afresh.
        _attempts("postgres", check_postgres, on_failure=connection.close)
        errors["postgres"] = None
    except Exception as exc:
        errors["postgres"] = exc
    for name, future in remote.items():
        # The check's own budget, and a little more for its last attempt's timeout; an
        # accelerator is not worth more than one attempt's time to the probe.
        wait = settings.HEALTH_READY_BUDGET + 1.0 - (time.monotonic() - started)
        if name in ACCELERATORS:
            wait = min(wait, settings.HEALTH_CHECK_TIMEOUT + RETRY_PAUSE)
        try:
            future.result(timeout=max(wait, 0))
            errors[name] = None
        except FutureTimeout:
            errors[name] = TimeoutError(f"no answer within {settings.HEALTH_READY_BUDGET} s")
        except Exception as exc:
            errors[name] = exc

    for name, error in errors.items():
        if error is not None:
            logger.warning("readiness check %s failed: %r", name, error)
    checks = {
        name: "ok" if error is None else "degraded" if name in ACCELERATORS else "failed"
        for name, error in errors.items()
    }
    failed = [name for name, state in checks.items() if state == "failed"]
    degraded = [name for name, state in checks.items() if state == "degraded"]
    if failed:
        body = {"status": "unavailable", "failed": failed, "checks": checks}
        if degraded:
            body["degraded"] = degraded
        return JsonResponse(body, status=503)
    if degraded:
        return JsonResponse({"status": "degraded", "degraded": degraded, "checks": checks})
    return JsonResponse({"status": "ok", "checks": checks})
