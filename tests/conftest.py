"""Fixtures shared by every test module.

Tests talk to the real PostgreSQL, Redis and broker. Each test session uses its
own Redis key prefix, so two runs on one machine do not steal each other's signals.
"""

from __future__ import annotations

import os
import uuid

import pika
import pytest
import redis
from django.conf import settings
from hypothesis import settings as hypothesis_settings

from tests.aws import moto_endpoint  # noqa: F401
from tests.factories import PlatformAdminFactory, TenantFactory, UserFactory
from tests.private_services import (  # noqa: F401
    migrated_database,
    private_postgres,
    private_rabbitmq,
    private_rabbitmq_factory,
    private_redis,
    running_private_rabbitmq,
)

# Hypothesis: in CI the examples follow from the tests alone (the same on every run, nothing
# to replay, so no example database), and no example is failed for its time on a busy machine.
hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, database=None)
hypothesis_settings.register_profile("dev", deadline=None)
hypothesis_settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


@pytest.fixture(scope="session")
def redis_key_prefix() -> str:
    return f"hubdommed-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def _isolated_wake_key(settings, redis_key_prefix):
    settings.REDIS_KEY_PREFIX = redis_key_prefix
    settings.OUTBOX_WAKE_KEY = f"{redis_key_prefix}:outbox:wake"
    yield
    redis_conn = redis.Redis.from_url(settings.REDIS_URL)
    try:
        redis_conn.delete(settings.OUTBOX_WAKE_KEY)
    except redis.RedisError:
        pass
    finally:
        redis_conn.close()


@pytest.fixture(autouse=True)
def _own_cache_namespace(settings, redis_key_prefix):
    """Cache entries (throttle counters) of one test never reach another, nor another run."""
    caches = {alias: dict(config) for alias, config in settings.CACHES.items()}
    caches["default"]["KEY_PREFIX"] = f"{redis_key_prefix}:{uuid.uuid4().hex[:8]}"
    settings.CACHES = caches


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # The production hasher is slow on purpose; the suite hashes hundreds of passwords.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="session")
def exchange_name():
    """A RabbitMQ exchange of this test session's own, deleted at its end."""
    name = f"dom_med_test_{uuid.uuid4().hex[:8]}"
    yield name
    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        conn.channel().exchange_delete(name)
    finally:
        conn.close()


@pytest.fixture
def redis_conn():
    conn = redis.Redis.from_url(settings.REDIS_URL)
    yield conn
    conn.close()


@pytest.fixture
def tenant(db):
    return TenantFactory()


@pytest.fixture
def other_tenant(db):
    return TenantFactory()


@pytest.fixture
def user(tenant):
    return UserFactory(tenant=tenant)


@pytest.fixture
def platform_admin(db):
    """Staff without a tenant: runs the catalog and the tenants."""
    return PlatformAdminFactory()
