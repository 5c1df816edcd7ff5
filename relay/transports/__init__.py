"""Broker transports, chosen by ``settings.BROKER``."""

from __future__ import annotations

from django.conf import settings

from relay.transports.base import OutgoingMessage, SendResult, Transport, TransportUnavailable

__all__ = ["OutgoingMessage", "SendResult", "Transport", "TransportUnavailable", "get_transport"]


def get_transport(broker: str | None = None) -> Transport:
    broker = broker or settings.BROKER
    if broker == "rabbitmq":
        from relay.transports.rabbitmq import RabbitMQTransport

        return RabbitMQTransport()
    if broker == "sqs":
        from relay.transports.sqs import SQSTransport

        return SQSTransport()
    raise ValueError(f"unknown broker {broker!r} (known: rabbitmq, sqs)")
