"""A Redis that hangs costs no more than one that is down.

A private redis-server, frozen with SIGSTOP: connections are accepted by the kernel and
nothing ever answers, so every call waits out its socket timeout. The wake signals and the
login throttles pay that once per outage, the relay's wait stays within its sweep, and
readiness answers 200 with Redis named as degraded.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time

import pytest
import redis
from django.test import Client
from rest_framework.test import APIClient

from common import health
from common.accelerator import redis_hold_off
from common.heartbeats import heartbeat_record
from outbox.wake import signal_relay
from relay.management.commands.run_relay import Command as RelayCommand
from tests.factories import UserFactory
from tests.identity.support import login
from tests.polling import wait_until
from tests.ports import free_port

pytestmark = pytest.mark.django_db

TIMEOUT = 0.3


@pytest.fixture
def frozen_redis(private_redis, settings):
    """The settings pointed at a private Redis (cache included), which is then frozen."""
    settings.REDIS_URL = private_redis.url
    settings.REDIS_SOCKET_TIMEOUT = TIMEOUT
    settings.REDIS_HOLD_OFF_SECONDS = 1.0
    settings.CACHES = {
        "default": {
            **settings.CACHES["default"],
            "LOCATION": private_redis.url,
            "OPTIONS": {"socket_connect_timeout": TIMEOUT, "socket_timeout": TIMEOUT},
        }
    }
    private_redis.freeze()
    try:
        yield private_redis
    finally:
        private_redis.thaw()


def timed(action):
    started = time.monotonic()
    result = action()
    return result, time.monotonic() - started


def test_the_wake_signal_pays_one_timeout_per_hold_off_then_comes_back(frozen_redis, settings):
    sent, first = timed(signal_relay)
    assert sent is False
    assert first >= TIMEOUT * 0.8

    # Held off: skipped at once, as if Redis were down.
    results, rest = timed(lambda: [signal_relay() for _ in range(50)])
    assert results == [False] * 50
    # Not one timeout among them (each would be 0.3 s: 15 s in all); a bound ten times
    # what they may take on a loaded machine, still a tenth of one timeout each.
    assert rest < 50 * TIMEOUT / 10, f"50 signals took {rest:.2f} s while Redis was held off"

    frozen_redis.thaw()
    # The hold-off's probe finds Redis back within its interval, and the signals go again.
    wait_until(signal_relay, timeout=10, interval=0.2, message="the wake signal sent again")
    reader = redis.Redis.from_url(frozen_redis.url)
    try:
        assert reader.llen(settings.OUTBOX_WAKE_KEY) == 1
    finally:
        reader.close()


def test_login_pays_the_hung_cache_once_not_on_every_attempt(frozen_redis):
    user = UserFactory()
    api = APIClient(raise_request_exception=False)
    took = []
    for _ in range(6):
        response, seconds = timed(lambda: login(api, user.email))
        assert response.status_code == 200, response.content
        took.append(seconds)
    # The first pays one timeout (its second throttle skips the held-off cache); the others
    # none. Without the hold-off each of them paid two: the median of the others says which,
    # whatever a loaded machine adds to one of them.
    assert took[0] < TIMEOUT * 2 + 0.5, took
    assert statistics.median(took[1:]) < TIMEOUT, took


def test_readiness_answers_200_with_redis_degraded_within_one_attempt(frozen_redis, settings):
    settings.HEALTH_CHECK_TIMEOUT = 0.5
    health.forget()
    response, seconds = timed(lambda: Client().get("/health/ready"))
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "degraded"
    assert response.json()["checks"] == {"postgres": "ok", "redis": "degraded", "broker": "ok"}
    assert seconds < 0.5 + 1.0, seconds


def test_the_relays_wait_stays_within_its_sweep_interval(frozen_redis):
    relay = RelayCommand()
    _, seconds = timed(lambda: relay.wait_for_signal(timeout=2.0))
    # A BLPOP slice, its margin, then what is left of the interval; before, the socket's
    # timeout alone was six seconds (the bound leaves a loaded machine two of slack).
    assert seconds < 2.0 + 2.0, seconds


def test_a_daemons_heartbeat_record_pays_the_hung_cache_once(frozen_redis):
    _, first = timed(lambda: heartbeat_record("relay", time.time()))
    assert first >= TIMEOUT * 0.8
    _, rest = timed(lambda: [heartbeat_record("relay", time.time()) for _ in range(20)])
    assert rest < 0.2, rest


def test_a_forked_child_does_not_inherit_a_hold_off_it_has_no_probe_for(settings):
    # Redis refusing: the parent holds it off, and its probe thread stays in the parent.
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    assert signal_relay() is False
    assert redis_hold_off().admits() is False

    context = multiprocessing.get_context("fork")
    answer = context.Queue()
    child = context.Process(target=lambda: answer.put(redis_hold_off().admits()))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert answer.get(timeout=5) is True
