import logging
import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client, RequestFactory

from common import health
from tests.polling import wait_until
from tests.ports import free_port
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.django_db


def test_live_answers_ok():
    response = Client().get("/health/live")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_ready_checks_postgres_redis_and_the_broker():
    response = Client().get("/health/ready")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"] == {"postgres": "ok", "redis": "ok", "broker": "ok"}


def test_ready_names_redis_away_as_degraded_and_still_answers_200(settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    response = Client().get("/health/ready")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    assert body["degraded"] == ["redis"]
    assert body["checks"]["postgres"] == "ok"
    assert body["checks"]["redis"] == "degraded"


def test_with_the_broker_down_too_the_503_names_it_and_redis_as_degraded(settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    settings.RABBITMQ_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    response = Client().get("/health/ready")
    assert response.status_code == 503
    assert response.json() == {
        "status": "unavailable",
        "failed": ["broker"],
        "degraded": ["redis"],
        "checks": {"postgres": "ok", "redis": "degraded", "broker": "failed"},
    }


def test_ready_reports_an_unreachable_broker(settings):
    settings.RABBITMQ_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    response = Client().get("/health/ready")
    assert response.status_code == 503
    assert response.json()["failed"] == ["broker"]


def test_the_openapi_schema_and_docs_are_served():
    client = Client()
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    assert schema.json()["info"]["title"] == "Hub DomMed API"
    assert client.get("/api/docs/").status_code == 200


def test_ready_checks_sqs_when_it_is_the_broker(settings, moto_endpoint):
    settings.BROKER = "sqs"
    settings.SQS_ENDPOINT_URL = moto_endpoint
    response = Client().get("/health/ready")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["broker"] == "ok"

    settings.SQS_ENDPOINT_URL = f"http://127.0.0.1:{free_port()}"
    response = Client().get("/health/ready")
    assert response.status_code == 503
    assert response.json()["failed"] == ["broker"]


def test_the_schema_is_served_even_with_a_stale_token():
    response = Client().get(
        "/api/schema/", HTTP_ACCEPT="application/json", HTTP_AUTHORIZATION="Bearer expired.token"
    )
    assert response.status_code == 200


# --- Readiness under load and failure ------------------------------------------------------


@pytest.fixture
def probes(settings):
    """Readiness with every check made afresh, and short timeouts."""
    settings.HEALTH_READY_CACHE_SECONDS = 0
    settings.HEALTH_CHECK_TIMEOUT = 0.5
    settings.HEALTH_READY_BUDGET = 3.0
    health.forget()
    yield settings
    health.forget()


def port_of(url: str) -> int:
    return urlsplit(url).port


def through(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.replace(f":{parts.port}", f":{proxy.port}")).geturl()


def test_a_failed_dependency_is_named_and_its_reason_goes_to_the_log_only(probes, caplog):
    port = free_port()
    probes.REDIS_URL = f"redis://:redis-password@127.0.0.1:{port}/0"
    with caplog.at_level(logging.WARNING, logger="hubdommed.health"):
        response = Client().get("/health/ready")
    assert response.status_code == 200
    assert response.json() == {
        "status": "degraded",
        "degraded": ["redis"],
        "checks": {"postgres": "ok", "redis": "degraded", "broker": "ok"},
    }
    assert str(port) in caplog.text  # the reason, for the operator
    assert "refused" in caplog.text.lower()


def test_a_slow_first_answer_is_tried_again_within_the_budget(probes):
    held = threading.Event()
    with TcpProxy(port_of(settings.RABBITMQ_URL)) as proxy:
        # The first connection is accepted and then left silent past the attempt's timeout.
        proxy.before_forwarding = lambda number: number == 1 and held.wait(10)
        probes.RABBITMQ_URL = through(settings.RABBITMQ_URL, proxy)
        try:
            response = Client().get("/health/ready")
        finally:
            held.set()
    assert response.status_code == 200, response.json()
    assert proxy.connections == 2


def test_the_checks_run_at_the_same_time(probes):
    # Each service answers only once the other has been asked too: checked one after the
    # other, the first would wait until its timeout, with no time left for another attempt.
    probes.HEALTH_CHECK_TIMEOUT = probes.HEALTH_READY_BUDGET = 2.0
    asked = {"redis": threading.Event(), "broker": threading.Event()}

    def answer_once_both_are_asked(me: str, other: str):
        def hook(number):
            asked[me].set()
            asked[other].wait(10)

        return hook

    with (
        TcpProxy(port_of(settings.REDIS_URL)) as redis_proxy,
        TcpProxy(port_of(settings.RABBITMQ_URL)) as broker_proxy,
    ):
        redis_proxy.before_forwarding = answer_once_both_are_asked("redis", "broker")
        broker_proxy.before_forwarding = answer_once_both_are_asked("broker", "redis")
        probes.REDIS_URL = through(settings.REDIS_URL, redis_proxy)
        probes.RABBITMQ_URL = through(settings.RABBITMQ_URL, broker_proxy)
        response = Client().get("/health/ready")
    assert response.status_code == 200, response.json()
    assert (redis_proxy.connections, broker_proxy.connections) == (1, 1)


def test_probes_at_the_same_time_share_one_broker_connection(probes):
    probes.HEALTH_CHECK_TIMEOUT = probes.HEALTH_READY_BUDGET = 5.0
    release = threading.Event()
    with TcpProxy(port_of(settings.RABBITMQ_URL)) as proxy:
        proxy.before_forwarding = lambda number: release.wait(10)
        probes.RABBITMQ_URL = through(settings.RABBITMQ_URL, proxy)
        factory = RequestFactory()
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = [pool.submit(ready_in_this_thread, factory) for _ in range(8)]
            # Release the broker once the first probe's connection is waiting on it.
            wait_until(
                lambda: proxy.connections >= 1, interval=0.01, message="a connection to the proxy"
            )
            release.set()
            statuses = [answer.result(timeout=10).status_code for answer in answers]
    assert statuses == [200] * 8
    assert proxy.connections == 1


def test_a_recent_success_stands_for_the_probes_that_follow(probes):
    probes.HEALTH_READY_CACHE_SECONDS = 60
    with TcpProxy(port_of(settings.RABBITMQ_URL)) as proxy:
        probes.RABBITMQ_URL = through(settings.RABBITMQ_URL, proxy)
        for _ in range(5):
            assert Client().get("/health/ready").status_code == 200
    assert proxy.connections == 1


def test_a_failure_is_not_remembered(probes):
    probes.HEALTH_READY_CACHE_SECONDS = 60
    refuse = threading.Event()
    refuse.set()
    with TcpProxy(port_of(settings.RABBITMQ_URL)) as proxy:
        # While refusing, the proxy hangs up at once: the broker looks down.
        proxy.before_forwarding = lambda number: refuse.is_set() and _hang_up()
        probes.RABBITMQ_URL = through(settings.RABBITMQ_URL, proxy)
        assert Client().get("/health/ready").status_code == 503
        refuse.clear()
        assert Client().get("/health/ready").status_code == 200


def ready_in_this_thread(factory: RequestFactory):
    """A readiness probe served by the calling thread, as a server's thread would."""
    try:
        return health.ready(factory.get("/health/ready"))
    finally:
        # The thread's own database connection, which no request_finished closes here.
        connection.close()


def _hang_up():
    raise ConnectionAbortedError("refused on purpose")


def test_a_check_that_ends_before_the_probe_tracks_it_does_not_block(probes, monkeypatch):
    # On a busy machine a check can end before the probe that started it has recorded it:
    # then its completion runs in the probe's own thread, at once.
    class AtOnce(Executor):
        def submit(self, fn, /, *args, **kwargs):
            future = Future()
            try:
                future.set_result(fn(*args, **kwargs))
            except Exception as exc:
                future.set_exception(exc)
            return future

    monkeypatch.setattr(health, "_executor", AtOnce())
    answers = []
    probe = threading.Thread(
        target=lambda: answers.append(ready_in_this_thread(RequestFactory())), daemon=True
    )
    probe.start()
    probe.join(timeout=30)
    assert not probe.is_alive(), "the probe is stuck"
    assert answers[0].status_code == 200
