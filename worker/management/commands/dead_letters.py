"""``manage.py dead_letters``: see what sits in the dead-letter queues, send some back.

    manage.py dead_letters                          # count and list, every queue class
    manage.py dead_letters --queue default          # list one
    manage.py dead_letters --queue default --requeue RUN_ID [RUN_ID ...]
    manage.py dead_letters --queue default --requeue-all

A message sent back goes to its queue without its error context, and its run starts
afresh: ``queued``, with its receive count back to 0.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from broker import TransportUnavailable, get_dead_letter_box, topology
from broker.consume import DeadLetter
from broker.topology import QUEUES
from outbox.runs import requeue_failed_run


class Command(BaseCommand):
    help = "List the messages in the dead-letter queues, or send chosen ones back to their queue."

    def add_arguments(self, parser):
        parser.add_argument(
            "--queue",
            action="append",
            default=[],
            help="a queue class or automation-<id> (repeatable; default: the four classes)",
        )
        parser.add_argument("--requeue", nargs="+", default=[], metavar="RUN_ID")
        parser.add_argument("--requeue-all", action="store_true")
        parser.add_argument("--limit", type=int, default=1000, help="messages looked at per queue")

    def handle(self, *args, queue, requeue, requeue_all, limit, **options) -> None:
        destinations = queue or list(QUEUES)
        for destination in destinations:
            try:
                topology.check_destination(destination)
            except topology.UnknownDestination as exc:
                raise CommandError(str(exc)) from None
        if requeue and requeue_all:
            raise CommandError("give either --requeue RUN_ID... or --requeue-all, not both")
        if limit < 1:
            raise CommandError("--limit must be at least 1")
        wanted = set(requeue)
        box = get_dead_letter_box()
        try:
            for destination in destinations:
                if requeue or requeue_all:
                    sent = box.requeue(
                        destination,
                        lambda letter: requeue_all or letter.run_id in wanted,
                        limit,
                    )
                    for letter in sent:
                        if letter.run_id:
                            requeue_failed_run(letter.run_id)
                        wanted.discard(letter.run_id)
                        self.stdout.write(
                            f"requeued {letter.run_id} {letter.task} -> {destination}"
                        )
                else:
                    # Counted first: listing hides messages for a while on SQS.
                    waiting = box.count(destination)
                    letters = box.peek(destination, limit)
                    shown = f" (the first {len(letters)} listed)" if len(letters) < waiting else ""
                    self.stdout.write(
                        f"{topology.dead_letter_queue_name(destination)}: {waiting} waiting{shown}"
                    )
                    for letter in letters:
                        self.stdout.write("  " + _line(letter))
        except TransportUnavailable as exc:
            raise CommandError(f"broker unreachable: {exc}") from exc
        finally:
            box.close()
        if wanted:
            raise CommandError(f"not found in the dead-letter queues: {', '.join(sorted(wanted))}")


def _line(letter: DeadLetter) -> str:
    error = letter.error
    if not error:
        return f"{letter.run_id} {letter.task} (moved by the broker after too many receives)"
    return (
        f"{letter.run_id} {letter.task} receives={error.get('x-error-receive-count', '?')} "
        f"at={error.get('x-error-failed-at', '?')} "
        f"{error.get('x-error-type', '?')}: {error.get('x-error-message', '')}"
    )
