"""How every RabbitMQ connection of the project is opened: one attempt, bounded waits.

The publisher, the consumer, the dead-letter box and the health check all connect this
way, so that a broker that does not answer costs each of them the same few seconds and
then a clear error, never a hang.
"""

from __future__ import annotations

import pika
from django.conf import settings

# Seconds to wait for the broker to open a connection or answer a batch.
CONNECT_TIMEOUT = 5.0
ANSWER_TIMEOUT = 30.0


def connection_parameters(url: str | None = None) -> pika.URLParameters:
    params = pika.URLParameters(url or settings.RABBITMQ_URL)
    params.connection_attempts = 1
    params.retry_delay = 0
    params.socket_timeout = CONNECT_TIMEOUT
    params.stack_timeout = CONNECT_TIMEOUT
    params.blocked_connection_timeout = ANSWER_TIMEOUT
    return params
