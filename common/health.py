"""Liveness and readiness probes.

``/health/live`` says the process serves requests. ``/health/ready`` checks each
dependency the API needs to do useful work and names the one that failed, so an
operator reading a 503 knows where to look.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET

logger = logging.getLogger("hubdommed.health")

PROBE_TIMEOUT = 2.0


def check_postgres() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def check_redis() -> None:
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT
    )
    try:
        client.ping()
    finally:
        client.close()


def check_broker() -> None:
    # The same connection settings as the relay's, with the probe's short timeouts.
    if settings.BROKER == "rabbitmq":
        import pika

        from broker.rabbitmq.publisher import connection_parameters

        params = connection_parameters()
        params.socket_timeout = params.stack_timeout = PROBE_TIMEOUT
        pika.BlockingConnection(params).close()
    else:
        from broker.sqs.publisher import sqs_client

        client = sqs_client(timeout=PROBE_TIMEOUT, attempts=1)
        client.list_queues(QueueNamePrefix=settings.QUEUE_PREFIX, MaxResults=1)


CHECKS: dict[str, Callable[[], None]] = {
    "postgres": check_postgres,
    "redis": check_redis,
    "broker": check_broker,
}


@require_GET
def live(request):
    return JsonResponse({"status": "ok"})


@require_GET
def ready(request):
    results: dict[str, str] = {}
    failed: list[str] = []
    for name, check in CHECKS.items():
        try:
            check()
        except Exception as exc:
            logger.warning("readiness check %s failed: %s", name, exc)
            results[name] = f"error: {type(exc).__name__}: {exc}"[:300]
            failed.append(name)
        else:
            results[name] = "ok"
    if failed:
        return JsonResponse(
            {"status": "unavailable", "failed": failed, "checks": results}, status=503
        )
    return JsonResponse({"status": "ok", "checks": results})
