"""Use cases of machines: power an automation's machine on, restart it, stop idle ones.

They run in background tasks and daemons, never inside a request: providers call out to
other systems (a process table, AWS) and may be slow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from automation.machines import MachineState, PowerOn, provider_for
from automation.models import Worker
from automation.services import worker_rotate_credential

logger = logging.getLogger("hubdommed.machines")

# Machines one sweep looks at, at most (each may cost the provider a question or two):
# what is left waits for the next cycle.
STOP_IDLE_LIMIT = 50


def machine_power_on(*, automation_id: int) -> PowerOn | None:
    """Power on the automation's machine unless it is up already. Idempotent.

    Returns what the provider did, or None when there is nothing to power on (the
    automation or its worker is inactive). A machine the hub provisions itself (``local``)
    gets a fresh credential, issued only once the provider knows it will start it.
    """
    worker = _active_worker(automation_id)
    if worker is None:
        logger.info("automation %s: nothing to power on (inactive)", automation_id)
        return None
    provider = provider_for(worker)
    outcome = provider.power_on(worker, issue_credential=_credential_issuer(provider, worker))
    if outcome == PowerOn.STARTED:
        Worker.objects.filter(pk=worker.pk).exclude(status=Worker.Status.ONLINE).update(
            status=Worker.Status.STARTING, updated_at=timezone.now()
        )
    else:
        # Found running while the row said off (started from outside, a stop that did not
        # take): up and not heard from yet, so stopped once idle if it never speaks.
        Worker.objects.filter(pk=worker.pk, status=Worker.Status.OFFLINE).update(
            status=Worker.Status.STARTING, updated_at=timezone.now()
        )
    logger.info("automation %s: machine %s (%s)", automation_id, outcome, worker.provider)
    return outcome


def machine_restart(
    *, automation_id: int, only_running: bool = False, silent_since: datetime | None = None
) -> PowerOn | None:
    """Restart the automation's machine, so that its worker starts afresh (with a fresh
    credential where the hub provisions it). Returns what the provider did, or None when
    nothing was done.

    ``only_running``: a machine that is not running is left off (after a rotation: the
    next power-on starts it with the new credential anyway). ``silent_since``: only if
    the worker has not been heard from since then (the monitor's request; a worker that
    spoke up meanwhile is fine after all).
    """
    worker = _active_worker(automation_id)
    if worker is None:
        return None
    if silent_since is not None and _heard_since(worker, silent_since):
        logger.info("automation %s: its worker spoke up; no restart", automation_id)
        return None
    provider = provider_for(worker)
    if only_running and provider.state(worker) != MachineState.RUNNING:
        logger.info("automation %s: machine not running; nothing to restart", automation_id)
        return None
    outcome = provider.restart(worker, issue_credential=_credential_issuer(provider, worker))
    # Silent from now on only once it had time to start.
    Worker.objects.filter(pk=worker.pk).update(
        status=Worker.Status.STARTING, updated_at=timezone.now()
    )
    logger.info("automation %s: machine restarted (%s)", automation_id, worker.provider)
    return outcome


def _active_worker(automation_id: int) -> Worker | None:
    return (
        Worker.objects.select_related("automation")
        .filter(automation_id=automation_id, is_active=True, automation__is_active=True)
        .first()
    )


def _heard_since(worker: Worker, moment: datetime) -> bool:
    return worker.last_seen_at is not None and worker.last_seen_at >= moment


def _credential_issuer(provider, worker: Worker):
    if not provider.needs_credential():
        return None

    def issue_credential() -> str:
        return worker_rotate_credential(
            automation_id=worker.automation_id, actor="system", restart_worker=False
        ).credential

    return issue_credential


def machines_stop_idle(
    *,
    idle_for: timedelta,
    busy_automation_ids: set[int],
    has_work: Callable[[int], bool] = lambda automation_id: False,
    stopping: Callable[[], bool] = lambda: False,
) -> int:
    """Stop the ``ec2`` machines not seen for ``idle_for`` whose automation has no work.

    ``busy_automation_ids`` are automations with pending or running jobs, and ``has_work``
    asks again for one automation right before its machine is stopped, since a job may
    have come (and powered it on) while the sweep went round (the caller knows jobs; this
    module does not). ``stopping``: the sweep ends between two machines when it says so.
    Returns how many machines were asked to stop.

    A ``starting`` machine's idle time counts from its power-on (the row's last write), a
    seen one's from when it was last seen. A row that says ``offline`` is a belief, and a
    machine can run under it (started from outside the hub, a stop that did not take):
    such a row, written more than ``idle_for`` ago, is probed (one question to the
    provider) and its machine stopped if it runs; found off, the row is touched, so the
    next probe comes an idle time later.
    """
    now = timezone.now()
    cutoff = now - idle_for
    unseen = Q(last_seen_at__lt=cutoff) | Q(last_seen_at__isnull=True)
    idle = (
        Worker.objects.select_related("automation")
        .filter(provider=Worker.Provider.EC2, is_active=True)
        .filter(
            Q(status=Worker.Status.ONLINE)
            & (Q(last_seen_at__lt=cutoff) | Q(last_seen_at__isnull=True, updated_at__lt=cutoff))
            | Q(status__in=[Worker.Status.STARTING, Worker.Status.OFFLINE], updated_at__lt=cutoff)
            & unseen
        )
        .exclude(automation_id__in=busy_automation_ids)
        .order_by("updated_at")
    )
    stopped = 0
    for worker in idle[:STOP_IDLE_LIMIT]:
        if stopping():
            break
        provider = provider_for(worker)
        if worker.status == Worker.Status.OFFLINE and not _runs_after_all(provider, worker):
            continue
        if has_work(worker.automation_id):
            continue  # a job came meanwhile: its power-on is on its way
        try:
            provider.power_off(worker)
        except Exception:
            # One machine the provider cannot stop must not keep the others running.
            logger.exception("automation %s: could not stop its machine", worker.automation_id)
            continue
        with transaction.atomic():
            # Unless a power-on wrote the row meanwhile (it starts the machine again).
            Worker.objects.filter(pk=worker.pk, status=worker.status).update(
                status=Worker.Status.OFFLINE, updated_at=timezone.now()
            )
        if worker.status == Worker.Status.OFFLINE:
            logger.warning(
                "automation %s: its machine ran while the hub held it off: stopped",
                worker.automation_id,
            )
        stopped += 1
    return stopped


def _runs_after_all(provider, worker: Worker) -> bool:
    """Whether the machine of a row that says ``offline`` runs. Not running, or not known
    (the provider unreachable, the machine gone), the row is touched: asked again an idle
    time later, not every cycle."""
    try:
        if provider.state(worker) == MachineState.RUNNING:
            return True
    except Exception:
        logger.exception(
            "automation %s: could not ask for its machine's state", worker.automation_id
        )
    Worker.objects.filter(pk=worker.pk, status=Worker.Status.OFFLINE).update(
        updated_at=timezone.now()
    )
    return False
