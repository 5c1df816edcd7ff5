"""``manage.py setup_broker``: declare the broker topology (idempotent).

The exchange, the four queue classes with their dead-letter queues, delivery limit and
bindings; ``--automation ID`` adds the own queue of each given automation.

A broker that does not answer yet (still starting, slow) is waited for, trying again
with a growing pause, for at most ``--wait`` seconds (``BROKER_WAIT_SECONDS``, 60).
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from broker import TransportUnavailable, get_transport, topology
from broker.topology import QUEUES, automation_queue_name
from lifecycle import Stop
from lifecycle.values import number_option


class Command(BaseCommand):
    help = "Declare the exchange, queues, dead-letter queues and bindings on the broker."

    def add_arguments(self, parser):
        parser.add_argument(
            "--automation",
            type=number_option(whole=True, minimum=1, maximum=2**63 - 1),
            action="append",
            default=[],
            metavar="ID",
            help="also create this automation's own queue (repeatable)",
        )
        parser.add_argument(
            "--wait",
            type=number_option(minimum=0),
            default=settings.BROKER_WAIT_SECONDS,
            metavar="SECONDS",
            help="wait at most this long for the broker to answer (default: "
            "BROKER_WAIT_SECONDS); 0 tries once",
        )

    def handle(self, *args, automation: list[int], wait: float, **options) -> str:
        destinations = [*QUEUES, *(automation_queue_name(i) for i in automation)]
        # A stop asked for while the broker is waited for (an orchestrator's SIGTERM, a
        # Ctrl-C) ends the wait at once, with one line and exit 1: the topology is not
        # declared, so what was to run after it (`setup_broker && run_relay`) does not.
        stop = Stop()
        stop.install()
        deadline = time.monotonic() + max(0.0, wait)
        pause = 1.0
        while True:
            try:
                self._declare(destinations)
                break
            except topology.UnknownDestination as exc:
                raise CommandError(f"broker topology not declared: {exc}") from exc
            except TransportUnavailable as exc:
                if stop.requested:
                    raise CommandError(_stopped()) from None
                if time.monotonic() + pause > deadline:
                    raise CommandError(
                        f"broker topology not declared: no answer from {broker_address()} "
                        f"within {wait:g} s: {exc}"
                    ) from exc
                self.stderr.write(
                    f"waiting for the broker ({broker_address()}) to answer: {exc}; "
                    f"trying again in {pause:g} s"
                )
                if stop.wait(pause):
                    raise CommandError(_stopped()) from None
                pause = min(pause * 2, 5.0)
        where = f"exchange {settings.RABBITMQ_EXCHANGE}" if settings.BROKER == "rabbitmq" else "SQS"
        names = ", ".join(topology.queue_name(d) for d in destinations)
        return f"{settings.BROKER}: {where}; queues {names} (each with its -dlq)"

    def _declare(self, destinations: list[str]) -> None:
        transport = get_transport()
        try:
            transport.setup_topology()
            for destination in destinations:
                transport.ensure_destination(destination)
        finally:
            transport.close()


def _stopped() -> str:
    return f"stopped while waiting for the broker ({broker_address()}): topology not declared"


def broker_address() -> str:
    """Where the broker is expected, without credentials."""
    if settings.BROKER == "sqs":
        return f"SQS at {settings.SQS_ENDPOINT_URL or 'AWS ' + settings.AWS_REGION}"
    nodes = [urlsplit(node) for node in settings.RABBITMQ_URL.split(",")]
    return "RabbitMQ at " + ", ".join(f"{url.hostname}:{url.port or 5672}" for url in nodes)
