"""Rows with no way forward: the check that finds them, machine by machine.

Every table with a status is a state machine, and its model says which states are final and
what moves each of the others (a queued run, a due time, a lease, a probe). A row in a
non-final state that nothing will move is a silent loss: a tenant's missing event, a job
nobody runs. Each app registers here, when Django starts it (``AppConfig.ready``), one check
per state machine it owns: a function that finds the rows that break the rule, gives each
one its way forward again, and says what it did. The stuck-job monitor (``watch_stuck_jobs``)
runs every check each cycle, counts what they repaired in
``hubdommed_stranded_rows_total{machine=...}`` and logs each row once, so that a defect of
this class shows on an operator's dashboard instead of in a tenant's missing events.

A check is one short transaction (or a few), takes the rows it repairs with SKIP LOCKED, and
leaves alone a row that is merely young (a delivery committed a moment ago whose run the
relay has not sent yet is on its way, not stranded): each check waits a margin of its own
before calling a row stranded. It reads a bounded number of rows per cycle (through a
partial index, with a LIMIT): one cycle does bounded work whatever the tables hold, and
what is left is found by the next. A row it cannot move itself is reported with
``repaired=False`` (see ``Repaired``). The machines' tables: docs/state-machines.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Repaired:
    """One row a check found stranded, and what gave it a way forward.

    ``repaired=False``: the check found the row stranded but cannot move it itself (what it
    needs is an operator's: a queue nobody consumes, a message the broker keeps refusing);
    ``action`` then says what the operator can do. The monitor logs such a row once, not
    every cycle it is found again, and shows how many there are in
    ``hubdommed_stranded_rows_unrepaired{machine=...}``.
    """

    # The row as an operator would look it up: "webhook delivery 17".
    row: str
    # What was wrong: "pending and parked, and its endpoint has no probing delivery".
    problem: str
    # What the check did: "scheduled an attempt", "failed with reason ...".
    action: str
    repaired: bool = True


StrandedCheck = Callable[[], list[Repaired]]

_checks: dict[str, StrandedCheck] = {}


def register_stranded_check(machine: str, check: StrandedCheck) -> None:
    """Run ``check`` in every monitor cycle; ``machine`` names the state machine (the metric's
    label: ``jobs``, ``task_runs``, ``outbox_messages``, ``webhook_deliveries``, ...)."""
    _checks[machine] = check


def stranded_checks() -> dict[str, StrandedCheck]:
    """Every registered check, by machine, in registration order."""
    return dict(_checks)
