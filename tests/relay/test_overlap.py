"""Two batches in flight: a crash or a lost broker connection while the broker holds both
loses nothing. Rows are marked sent only on their confirm; what was published but never
confirmed stays due and goes out again (duplicates, which consumers dedupe by run_id).

The broker's answers are held back by a proxy in front of the real RabbitMQ, so the relay
sits with two batches written and unconfirmed, each holding its rows' locks in its own
open transaction, at the moment the test strikes.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections import Counter

import pika
import pytest
from django.conf import settings as django_settings
from django.db import connection

from outbox.models import PlatformOutboxMessage
from relay.engine import OutboxRelay
from tests.polling import wait_until
from tests.processes import process_environment
from tests.relay.conftest import insert_pending_rows, run_ids
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = 100
ROWS = 1_000


class AnswerHoldingProxy(TcpProxy):
    """Forwards everything, except that the broker's bytes wait while ``hold()`` is on."""

    def __init__(self, target_port: int) -> None:
        self._flowing = threading.Event()
        self._flowing.set()
        super().__init__(target_port)

    def hold(self) -> None:
        self._flowing.clear()

    def close(self) -> None:
        super().close()
        self._flowing.set()  # the held pumps find their sockets closed and end

    def _pump(self, source, sink) -> None:
        try:
            from_broker = source.getpeername() == self.target
            while data := source.recv(65536):
                if from_broker:
                    self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.close()


def through(proxy: TcpProxy, url: str) -> str:
    params = pika.URLParameters(url)
    credentials = params.credentials
    return f"amqp://{credentials.username}:{credentials.password}@127.0.0.1:{proxy.port}/%2F"


def open_claims() -> int:
    """Transactions holding a claim's row locks right now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction' AND query LIKE '%%FOR UPDATE SKIP LOCKED%%'"
        )
        return cursor.fetchone()[0]


def queue_depth(rabbit, destination: str = "default") -> int:
    from broker import topology

    return rabbit.channel.queue_declare(
        topology.queue_name(destination), passive=True
    ).method.message_count


def pending_run_ids() -> set[str]:
    return {
        str(r)
        for r in PlatformOutboxMessage.objects.filter(
            sent_at__isnull=True, queue="default"
        ).values_list("run_id", flat=True)
    }


def two_batches_in_flight(rabbit) -> bool:
    # Both batches reached the broker (enqueued), neither confirm reached the relay; the
    # next batch may be claimed already (not published: the window is full).
    return open_claims() >= 2 and queue_depth(rabbit) == 2 * BATCH


def assert_all_arrived(expected: set[str], received: Counter) -> None:
    assert expected <= set(received), f"lost: {len(expected - set(received))}"
    duplicates = sum(1 for n in received.values() if n > 1)
    # Exactly the two batches published but never confirmed went out twice.
    assert duplicates == 2 * BATCH
    assert max(received.values()) == 2


def test_a_lost_broker_connection_with_two_batches_in_flight_loses_nothing(settings, rabbit):
    settings.RELAY_BATCH_SIZE = BATCH
    real_url = settings.RABBITMQ_URL
    with AnswerHoldingProxy(pika.URLParameters(real_url).port) as proxy:
        settings.RABBITMQ_URL = through(proxy, real_url)
        relay = OutboxRelay()
        relay.transport.setup_topology()
        # Two full batches: the relay opens its second publishing channel.
        insert_pending_rows(2 * BATCH)
        relay.drain()
        assert not pending_run_ids()
        rabbit.take_all("default")

        insert_pending_rows(ROWS)
        expected = pending_run_ids()
        proxy.hold()

        def cut_when_both_are_in_flight() -> None:
            try:
                wait_until(
                    lambda: two_batches_in_flight(rabbit),
                    timeout=20,
                    message="two batches published and unconfirmed",
                )
            finally:
                proxy.close()  # the connection drops under both batches
                connection.close()

        watcher = threading.Thread(target=cut_when_both_are_in_flight)
        watcher.start()
        relay.drain()
        watcher.join(timeout=30)

    assert relay.outages == 1
    rows = PlatformOutboxMessage.objects.filter(queue="default", run_id__in=expected)
    # Nothing marked sent without its confirm; both batches counted one attempt each.
    assert not rows.filter(sent_at__isnull=False).exists()
    assert Counter(rows.values_list("attempts", flat=True)) == {1: 2 * BATCH, 0: ROWS - 2 * BATCH}

    settings.RABBITMQ_URL = real_url
    relay.drain()
    relay.close()

    assert relay.outages == 0
    assert not pending_run_ids()
    assert_all_arrived(expected, run_ids(env for _, env in rabbit.take_all("default")))


def test_a_relay_killed_with_two_batches_in_flight_loses_nothing(settings, rabbit):
    real_url = settings.RABBITMQ_URL
    with AnswerHoldingProxy(pika.URLParameters(real_url).port) as proxy:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "run_relay"],
            cwd=django_settings.BASE_DIR,
            env=process_environment(
                settings,
                BROKER="rabbitmq",
                HUBDOMMED_RELAY="true",
                RABBITMQ_URL=through(proxy, real_url),
                RELAY_BATCH_SIZE=str(BATCH),
                RELAY_SWEEP_INTERVAL="0.2",
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            insert_pending_rows(2 * BATCH)
            wait_until(
                lambda: not pending_run_ids() or process.poll() is not None,
                timeout=30,
                message="the relay to send the first rows",
            )
            assert process.poll() is None
            rabbit.take_all("default")

            proxy.hold()
            insert_pending_rows(ROWS)
            expected = pending_run_ids()
            wait_until(
                lambda: two_batches_in_flight(rabbit),
                timeout=20,
                message="two batches published and unconfirmed",
            )
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
            _, err = process.communicate(timeout=10)

    # The killed relay's transactions end with its connections: the locks are released.
    wait_until(lambda: open_claims() == 0, timeout=10, message="the killed relay's claims")
    rows = PlatformOutboxMessage.objects.filter(queue="default", run_id__in=expected)
    assert not rows.filter(sent_at__isnull=False).exists(), err

    relay = OutboxRelay(batch_size=BATCH)
    relay.drain()
    relay.close()

    assert not pending_run_ids()
    assert_all_arrived(expected, run_ids(env for _, env in rabbit.take_all("default")))
