"""Fixtures shared by every test module.

Tests talk to the real PostgreSQL, Redis and broker. Each test session uses its
own Redis key prefix, so two runs on one machine do not steal each other's signals.

The suite runs on several processes (pytest-xdist, ``make test``): each worker has its own
test database (pytest-django names it ``test_<name>_gwN``), queue names, exchange and Redis
keys (``pytest_configure`` below), and loopback ports (``tests/ports.py``). The tests of
one file run on one worker, one after another; the reliability scenarios on two.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from pathlib import Path

import pika
import pytest
import redis
from django.conf import settings
from hypothesis import settings as hypothesis_settings

from common import accelerator
from lifecycle import conditions
from tests.aws import moto_endpoint, private_sqs  # noqa: F401
from tests.factories import PlatformAdminFactory, TenantFactory, UserFactory
from tests.private_services import (  # noqa: F401
    _private_postgres_cluster,
    _private_rabbitmq_node,
    migrated_database,
    private_postgres,
    private_rabbitmq,
    private_rabbitmq_factory,
    private_redis,
    running_private_rabbitmq,
)

RELIABILITY = Path(__file__).resolve().parent / "reliability"


def pytest_configure(config):
    """A pytest-xdist worker's own queue names, exchange and Redis keys, from its id.

    Django's settings are read before this runs (pytest-django sets Django up first), so
    the names are set on the settings themselves; ``tests.processes`` passes them on to the
    daemons a test starts.
    """
    config.pluginmanager.register(_GroupOrder(), "hubdommed-group-order")
    _hear_stop_signals()
    if config.getoption("dist", "no") == "loadgroup" and pytest.version_tuple[:2] >= (9, 2):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} ignores the node ids pytest-xdist renames to group "
            "tests: install the pytest that pyproject.toml asks for (make install)"
        )
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    settings.QUEUE_PREFIX = f"{settings.QUEUE_PREFIX}{worker}-"
    settings.RABBITMQ_EXCHANGE = f"{settings.RABBITMQ_EXCHANGE}-{worker}"
    settings.REDIS_KEY_PREFIX = f"{settings.REDIS_KEY_PREFIX}-{worker}"
    settings.OUTBOX_WAKE_KEY = f"{settings.REDIS_KEY_PREFIX}:outbox:wake"
    caches = {alias: dict(cache) for alias, cache in settings.CACHES.items()}
    caches["default"]["KEY_PREFIX"] = settings.REDIS_KEY_PREFIX
    settings.CACHES = caches


def _hear_stop_signals() -> None:
    """Let the processes the tests start hear the signals the tests stop them with (SIGINT,
    SIGTERM), however the suite was started.

    A command started in the background by a shell without job control (``make test &``
    in a script, a CI runner's step) inherits SIGINT ignored, and so would every process
    it starts: a daemon, ``make run`` and its script could not be stopped by the Ctrl-C
    the tests send them (an ignored signal stays ignored across exec, and a shell cannot
    trap one it was started ignoring). Python leaves an ignored signal ignored; a handler
    of its own is reset to the default in each process it execs.
    """
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    for signum, default in defaults.items():
        if signal.getsignal(signum) is signal.SIG_IGN:
            signal.signal(signum, default)


def _group(item) -> str:
    path = Path(item.path)
    if RELIABILITY in path.parents:
        # The broker's scenarios (its nodes stopped, reset, alarmed; a cluster losing
        # nodes) are a group of their own beside the others: two scenarios at once at most.
        return "reliability-broker" if path.name.startswith("test_broker_") else "reliability"
    if item.get_closest_marker("many_connections"):
        return "reliability"
    return item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """One xdist group a file (``--dist loadgroup``): a file's tests share module fixtures
    and private services, and some run in an order. The reliability scenarios form two
    groups, each run one scenario after another on its worker: the broker's scenarios
    (``test_broker_*.py``) and the others, about as long as each other. So at most two
    scenarios' process stacks load the machine at once, one of them breaking RabbitMQ and
    the other PostgreSQL, Redis, a receiver or a process. The tests marked
    ``many_connections`` join the second group, since PostgreSQL's connections
    (``max_connections``, 100 here) are shared by every worker and the scenarios' daemons
    (a scenario holds about a dozen; the largest of those tests fifty).

    First of the hooks: pytest-xdist reads the groups in its own hook, which runs before
    any ``trylast`` one (a group marked there would be no group at all).
    """
    if not config.pluginmanager.hasplugin("xdist"):
        return  # one process (-p no:xdist): no groups to hand out
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))


class _GroupOrder:
    """Groups are handed out in the order of the items (``make test`` passes
    ``--no-loadscope-reorder``): the two reliability groups first, as they are the longest
    by far and each runs on one worker, then the others, the largest first. Last of the
    hooks, after pytest-django's reordering (trylast), which keeps the order of a group's
    own items."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        # pytest-xdist applies a group by renaming the item ("...@group"); a pytest that
        # ignores the new name (9.2 does) would run a file's tests, and the scenarios, on
        # every worker at once. Said here, not found out by a loaded machine.
        if getattr(config.option, "loadgroup", False) and any(
            "@" not in item.nodeid for item in items
        ):
            raise pytest.UsageError(
                "pytest-xdist's groups are not applied (this pytest ignores the renamed "
                "node ids): install the pytest that pyproject.toml asks for"
            )
        groups = {item: _group(item) for item in items}
        sizes = Counter(groups.values())
        items.sort(
            key=lambda item: (
                not groups[item].startswith("reliability"),
                -sizes[groups[item]],
                groups[item],
            )
        )


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """A test ends with its database connection outside any transaction.

    One left inside an atomic block (a savepoint entered and never left, a transaction that
    outlived its test) would put every later test of this process under it: they would
    fail on TransactionManagementError, far from the cause. The connection is dropped and
    its bookkeeping reset, and the test that left it so fails here, named.
    """
    result = yield
    from django.db import connections

    leaked = [alias for alias in connections if connections[alias].in_atomic_block]
    for alias in leaked:
        conn = connections[alias]
        conn.atomic_blocks.clear()
        conn.savepoint_ids.clear()
        conn.in_atomic_block = False
        conn.needs_rollback = False
        conn.closed_in_transaction = False
        conn.close()  # outside a transaction now: the server rolls back what it held
    if leaked:
        raise RuntimeError(
            f"{item.nodeid} left the database connection {leaked} inside a transaction"
        )
    return result


@pytest.fixture(scope="session", autouse=True)
def _flush_by_delete():
    """Transactional tests empty the tables with DELETE, not TRUNCATE.

    Django's flush after each transactional test truncates every table; on PostgreSQL a
    TRUNCATE of some sixty tables costs seconds (each is a new file, then a checkpoint of
    the old ones), DELETE of the few rows a test wrote a few milliseconds. Foreign keys are
    not checked meanwhile (``session_replication_role = replica``, for this transaction
    only), so the order of the tables does not matter. A flush that resets sequences still
    truncates.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or not tables:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        return ["SET LOCAL session_replication_role = replica"] + [
            f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))}"
            for table in tables
        ]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = truncate


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
    # One test's Redis outage is not held against the next one's Redis.
    accelerator.forget()
    conditions.clear()
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
