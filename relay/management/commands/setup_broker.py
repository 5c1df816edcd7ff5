"""``manage.py setup_broker``: declare the broker topology (idempotent).

The exchange, the four queue classes with their dead-letter queues, delivery limit and
bindings; ``--automation ID`` adds the own queue of each given automation.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from outbox.models import QUEUES
from outbox.services import automation_queue_name
from relay import topology
from relay.transports import TransportUnavailable, get_transport


class Command(BaseCommand):
    help = "Declare the exchange, queues, dead-letter queues and bindings on the broker."

    def add_arguments(self, parser):
        parser.add_argument(
            "--automation",
            type=int,
            action="append",
            default=[],
            metavar="ID",
            help="also create this automation's own queue (repeatable)",
        )

    def handle(self, *args, automation: list[int], **options) -> str:
        destinations = [*QUEUES, *(automation_queue_name(i) for i in automation)]
        transport = get_transport()
        try:
            transport.setup_topology()
            for destination in destinations:
                transport.ensure_destination(destination)
        except (TransportUnavailable, topology.UnknownDestination) as exc:
            raise CommandError(f"broker topology not declared: {exc}") from exc
        finally:
            transport.close()
        where = f"exchange {settings.RABBITMQ_EXCHANGE}" if settings.BROKER == "rabbitmq" else "SQS"
        names = ", ".join(topology.queue_name(d) for d in destinations)
        return f"{settings.BROKER}: {where}; queues {names} (each with its -dlq)"
