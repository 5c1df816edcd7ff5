"""The private services themselves: each starts, goes away, and comes back as promised."""

from __future__ import annotations

import contextlib

import pika
import pika.exceptions
import psycopg
import pytest
import redis

from tests.polling import wait_until
from tests.private_services import PrivatePostgres, private_environment


def _amqp(url: str) -> pika.BlockingConnection:
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.socket_timeout = 2
    return pika.BlockingConnection(params)


def test_private_postgres_restarts_and_terminates_backends():
    pg = PrivatePostgres()
    try:
        pg.start()
        assert pg.port != 5432
        pg.create_database("hd_probe")
        conn = psycopg.connect(pg.url("hd_probe"), autocommit=True)
        assert pg.terminate_backends("hd_probe") == 1
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        conn = psycopg.connect(pg.url("hd_probe"), autocommit=True)
        pg.restart()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        assert pg.execute("SELECT 1", dbname="hd_probe") == [(1,)]
        pg.stop()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg.url(), connect_timeout=2)
        pg.start()
        assert pg.execute("SELECT current_setting('fsync')") == [("off",)]
    finally:
        pg.close()
    assert not pg.dir.exists()


def test_private_rabbitmq_stops_starts_and_resets(private_rabbitmq):
    conn = _amqp(private_rabbitmq.url)
    channel = conn.channel()
    channel.exchange_declare("probe", "topic", durable=True)
    channel.queue_declare("probe-q", durable=True)
    conn.close()

    private_rabbitmq.stop()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        _amqp(private_rabbitmq.url)
    private_rabbitmq.start()
    conn = _amqp(private_rabbitmq.url)
    # Durable definitions survive a stop.
    conn.channel().exchange_declare("probe", passive=True)
    conn.close()

    private_rabbitmq.reset()
    conn = _amqp(private_rabbitmq.url)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        conn.channel().exchange_declare("probe", passive=True)
    assert refused.value.reply_code == 404
    conn.close()


def test_private_rabbitmq_takes_config(private_rabbitmq_factory):
    node = private_rabbitmq_factory(config={"max_message_size": "65536"})
    conn = _amqp(node.url)
    channel = conn.channel()
    channel.basic_publish("", "nowhere", b"x" * 1000)
    channel.basic_publish("", "nowhere", b"x" * 100_000)

    def closed() -> bool:
        with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
            conn.process_data_events(0.2)
        return channel.is_closed

    # Over max_message_size: the broker closes the channel (406 PRECONDITION_FAILED).
    wait_until(closed, timeout=10, message="the channel closed by the broker")
    conn.close()


def test_private_redis_stops_and_starts(private_redis):
    conn = redis.Redis.from_url(private_redis.url, socket_connect_timeout=1)
    assert conn.ping()
    private_redis.stop()
    with pytest.raises(redis.ConnectionError):
        conn.ping()
    private_redis.start()
    assert wait_until(conn.ping, timeout=5, message="redis back")
    conn.close()


def test_migrated_database_serves_a_daemon(private_postgres, migrated_database, settings):
    env = private_environment(settings, postgres=private_postgres, database=migrated_database)
    assert env["DATABASE_URL"] == private_postgres.url(migrated_database)
    tables = private_postgres.execute(
        "SELECT count(*) FROM pg_tables WHERE tablename = 'platform_outbox_messages'",
        dbname=migrated_database,
    )
    assert tables == [(1,)]
