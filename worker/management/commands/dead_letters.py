"""``manage.py dead_letters``: see what sits in the dead-letter queues, send some back.

    manage.py dead_letters                          # count and list, every queue class
    manage.py dead_letters --queue default          # list one
    manage.py dead_letters --queue default --requeue RUN_ID [RUN_ID ...]
    manage.py dead_letters --queue default --requeue-all
    manage.py dead_letters --queue default --purge RUN_ID [RUN_ID ...]
    manage.py dead_letters --queue default --purge-all

A message sent back goes to its queue without its error context, and its run starts
afresh: ``queued``, with its receive count back to 0. A purged message is deleted for
good; its run stays ``failed``.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from broker import TransportUnavailable, topology
from broker.consume import DeadLetter
from broker.topology import QUEUES
from lifecycle.values import number_option
from worker.dead_letters import dead_letters_list, dead_letters_purge, dead_letters_redrive


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
        parser.add_argument("--purge", nargs="+", default=[], metavar="RUN_ID")
        parser.add_argument("--purge-all", action="store_true")
        parser.add_argument(
            "--limit",
            type=number_option(whole=True, minimum=1),
            default=1000,
            help="messages looked at per queue",
        )

    def handle(
        self, *args, queue, requeue, requeue_all, purge, purge_all, limit, **options
    ) -> None:
        destinations = queue or list(QUEUES)
        for destination in destinations:
            try:
                topology.check_destination(destination)
            except topology.UnknownDestination as exc:
                raise CommandError(str(exc)) from None
        chosen = [bool(requeue), requeue_all, bool(purge), purge_all]
        if sum(chosen) > 1:
            raise CommandError(
                "give one of --requeue RUN_ID..., --requeue-all, --purge RUN_ID..., --purge-all"
            )
        if limit < 1:
            raise CommandError("--limit must be at least 1")
        wanted = set(requeue) | set(purge)
        try:
            if purge or purge_all:
                self._act(
                    dead_letters_purge, destinations, purge_all, wanted, limit, "purged {} from {}"
                )
            elif requeue or requeue_all:
                self._act(
                    dead_letters_redrive,
                    destinations,
                    requeue_all,
                    wanted,
                    limit,
                    "requeued {} -> {}",
                )
            else:
                for parked in dead_letters_list(destinations, limit=limit):
                    letters = parked.letters
                    shown = (
                        f" (the first {len(letters)} listed)"
                        if len(letters) < parked.waiting
                        else ""
                    )
                    self.stdout.write(f"{parked.queue}: {parked.waiting} waiting{shown}")
                    for letter in letters:
                        self.stdout.write("  " + _line(letter))
        except TransportUnavailable as exc:
            raise CommandError(f"broker unreachable: {exc}") from exc
        if wanted:
            raise CommandError(f"not found in the dead-letter queues: {', '.join(sorted(wanted))}")

    def _act(
        self,
        action,
        destinations: list[str],
        every: bool,
        wanted: set[str],
        limit: int,
        done: str,
    ) -> None:
        # ``action`` purges or redrives the chosen run ids of each queue (all with ``every``);
        # what it handled leaves ``wanted``, so what is left was not found. ``done`` reports each
        # one: its run and task, then its queue.
        for destination in destinations:
            handled = action(
                destination,
                run_ids=None if every else set(wanted),
                limit=limit,
                actor="command:dead_letters",
            )
            for letter in handled:
                wanted.discard(letter.run_id)
                self.stdout.write(done.format(f"{letter.run_id} {letter.task}", destination))


def _line(letter: DeadLetter) -> str:
    error = letter.error
    if not error:
        return f"{letter.run_id} {letter.task} (moved by the broker after too many receives)"
    return (
        f"{letter.run_id} {letter.task} receives={error.get('x-error-receive-count', '?')} "
        f"at={error.get('x-error-failed-at', '?')} "
        f"{error.get('x-error-type', '?')}: {error.get('x-error-message', '')}"
    )
