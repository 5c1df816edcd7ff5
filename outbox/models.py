"""The outbox: what must be delivered, written in the transaction of the change.

``outbox_messages`` and ``platform_outbox_messages`` follow seed 000 exactly
(column names, types, defaults and constraint names); the migration adds what
the ORM cannot say (``GENERATED ALWAYS`` identity). ``task_runs`` tracks each
delivery by its ``run_id``; ``events`` is the permanent domain-event trail.

Both are state machines: an outbox row is unsent until the relay marks it sent (final:
``OUTBOX_ROW_WAY_FORWARD`` says what moves it); a run's final states are ``RUN_FINISHED``
and ``RUN_WAYS_FORWARD`` says what moves each other one. ``outbox.stranded`` is the
monitor's check that no row or run is left without it (docs/state-machines.md).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.lookups import Exact
from django.utils import timezone

from broker.topology import QUEUES
from common.models import choices_check


class Queue(models.TextChoices):
    CRITICAL = "critical"
    DEFAULT = "default"
    BULK = "bulk"
    MAINTENANCE = "maintenance"


def jsonb_typeof_is(field: str, kind: str) -> Exact:
    """``jsonb_typeof(<field>) = '<kind>'`` as a boolean expression for CHECK constraints."""
    return Exact(
        models.Func(models.F(field), function="jsonb_typeof", output_field=models.TextField()),
        models.Value(kind),
    )


def clock_timestamp() -> models.Func:
    """``clock_timestamp()``: the real time of the statement, not of the transaction."""
    return models.Func(function="clock_timestamp", output_field=models.DateTimeField())


class BaseOutboxMessage(models.Model):
    id = models.BigAutoField(primary_key=True)
    run_id = models.UUIDField()
    queue = models.TextField()
    envelope = models.JSONField()
    available_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True)
    attempts = models.IntegerField(db_default=0)
    created_at = models.DateTimeField(db_default=clock_timestamp())

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.envelope.get('task')} {self.run_id}"


def _outbox_meta_constraints(table: str) -> list:
    return [
        models.CheckConstraint(condition=Q(attempts__gte=0), name=f"{table}_attempts_check"),
        models.CheckConstraint(
            condition=jsonb_typeof_is("envelope", "object"), name=f"{table}_envelope_check"
        ),
        models.CheckConstraint(condition=Q(queue__in=QUEUES), name=f"{table}_queue_check"),
        models.UniqueConstraint(fields=["run_id"], name=f"{table}_run_id_key"),
    ]


def _outbox_meta_indexes(prefix: str) -> list:
    return [
        # The relay's batch query: pending rows in id order (partial, so it stays small
        # however much history the table keeps).
        models.Index(
            fields=["id"],
            include=["available_at"],
            condition=Q(sent_at__isnull=True),
            name=f"{prefix}_pending_idx",
        ),
        # maintenance.purge: sent rows by age.
        models.Index(
            fields=["sent_at"], condition=Q(sent_at__isnull=False), name=f"{prefix}_sent_idx"
        ),
    ]


# What moves an unsent outbox row (``sent_at`` NULL) to sent, its final state.
OUTBOX_ROW_WAY_FORWARD = (
    "available_at and the relay's sweep (the Redis wake only speeds it up): due rows are "
    "claimed, sent and marked sent in one transaction; a row the broker refuses backs off "
    "exponentially, capped by RELAY_RETRY_BACKOFF_MAX, and is tried again (never dropped: "
    "it is the only copy of a committed change); no delay goes past OUTBOX_MAX_DELAY_SECONDS"
)


class OutboxMessage(BaseOutboxMessage):
    """Tenant work. ``sent_at`` NULL means pending."""

    tenant = models.ForeignKey(
        "identity.Tenant", on_delete=models.PROTECT, db_constraint=True, related_name="+"
    )

    class Meta:
        db_table = "outbox_messages"
        constraints = _outbox_meta_constraints("outbox_messages")
        indexes = _outbox_meta_indexes("outbox_messages")


class PlatformOutboxMessage(BaseOutboxMessage):
    """Work without a tenant: catalog, system, schedules."""

    class Meta:
        db_table = "platform_outbox_messages"
        constraints = _outbox_meta_constraints("platform_outbox_messages")
        # "platform_outbox_...": the names the migrations gave these indexes.
        indexes = _outbox_meta_indexes("platform_outbox")


class TaskRunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


# A failed run starts again only by an operator (the admin's Requeue, a dead letter sent
# back): for the machine it is final.
RUN_FINISHED = (TaskRunStatus.SUCCEEDED, TaskRunStatus.FAILED)
# What moves a run in each state that is not final (docs/worker.md tells the details).
RUN_WAYS_FORWARD = {
    TaskRunStatus.QUEUED: (
        "its message: its outbox row, due (the relay sends it) or sent (the broker delivers "
        "it to a worker, whose claim makes the run running)"
    ),
    TaskRunStatus.RUNNING: (
        "its holder's outcome; or its lease (the queue's visibility, extended by the "
        "holder's heartbeat): once expired, the message the broker gives back (RabbitMQ at "
        "once, SQS by visibility) claims the run again"
    ),
    TaskRunStatus.RETRYING: (
        "its message coming back after the backoff: its re-armed outbox row (RabbitMQ) or "
        "the broker's own delay (SQS visibility)"
    ),
}


class TaskRunQuerySet(models.QuerySet):
    """The one transition of task runs that takes a run from whatever state it is in.

    The guarded ones (a run moves only from the states they name) are statements of
    ``outbox.runs``: each names its runs by key and checks their state on the rows it
    locked, never as a condition beside the key, where the planner may answer it from
    ``task_runs_unfinished_idx`` and walk every unfinished run for one."""

    def fail(self, *, error: str) -> int:
        """Whatever it was -> failed, for good (until an operator starts it again)."""
        now = timezone.now()
        return self.update(
            status=TaskRunStatus.FAILED,
            last_error=error,
            lease_expires_at=None,
            finished_at=now,
            updated_at=now,
        )


class TaskRun(models.Model):
    """One delivery of one task, from the outbox to its end. Keyed by the envelope's run_id."""

    Status = TaskRunStatus

    run_id = models.UUIDField(primary_key=True)
    task = models.TextField()
    queue = models.TextField(choices=Queue.choices)
    event = models.TextField(blank=True, default="")
    tenant = models.ForeignKey(
        "identity.Tenant", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    status = models.TextField(choices=Status.choices, default=Status.QUEUED)
    receive_count = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    correlation_id = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=clock_timestamp())
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # While ``running``: who holds the run and until when. A worker claims a run only if
    # it is queued, retrying, or running under an expired lease; the holder's heartbeat
    # extends it (see docs/worker.md).
    lease_holder = models.TextField(blank=True, db_default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # When the monitor's check of stranded runs (``outbox.stranded``) last re-armed the
    # run's outbox row because nothing had claimed its message for too long. Found stranded
    # again with nothing in between (``updated_at`` still this), it is not re-sent again:
    # it is left to an operator (no worker consumes its queue, say).
    rearmed_at = models.DateTimeField(null=True, blank=True)

    objects = TaskRunQuerySet.as_manager()

    class Meta:
        db_table = "task_runs"
        constraints = [
            choices_check("task_runs", "status", TaskRunStatus),
            models.CheckConstraint(condition=Q(queue__in=QUEUES), name="task_runs_queue_check"),
            models.CheckConstraint(
                condition=Q(receive_count__gte=0), name="task_runs_receive_count_check"
            ),
        ]
        indexes = [
            # Operators look for what is stuck or failing.
            models.Index(
                fields=["status", "updated_at"],
                condition=~Q(status="succeeded"),
                name="task_runs_unfinished_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task} {self.run_id} {self.status}"


class Event(models.Model):
    """The permanent trail of domain events. Never purged."""

    id = models.BigAutoField(primary_key=True)
    type = models.TextField()
    aggregate_type = models.TextField()
    aggregate_id = models.TextField()
    tenant = models.ForeignKey(
        "identity.Tenant", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Who caused it: "user:<id>", "worker:<id>", "system" (a daemon) or "task:<name>".
    actor = models.TextField()
    payload = models.JSONField()
    correlation_id = models.TextField(blank=True, default="")
    occurred_at = models.DateTimeField(db_default=clock_timestamp())

    class Meta:
        db_table = "events"
        constraints = [
            models.CheckConstraint(
                condition=jsonb_typeof_is("payload", "object"), name="events_payload_check"
            ),
        ]
        # GET /events (``outbox.selectors.event_list``) reads the trail newest first by id,
        # keyset-paginated on it: each filter has an index ending in id, one with the tenant
        # first for a tenant's list and one without for a platform admin's, so a page reads
        # its rows and stops however deep it is. A time range becomes an id range
        # (``events_occurred_idx``), which each of these indexes bounds.
        indexes = [
            # "What happened to this job / automation?"; GET /events?aggregate_type=&
            # aggregate_id= (an aggregate is one tenant's or the platform's, so a tenant's
            # list only checks the tenant of that aggregate's few rows).
            models.Index(
                fields=["aggregate_type", "aggregate_id", "id"], name="events_aggregate_idx"
            ),
            # A tenant's list with no filter (or a time range only).
            models.Index(fields=["tenant", "id"], name="events_tenant_idx"),
            # GET /events?type=, a tenant's and across tenants.
            models.Index(fields=["tenant", "type", "id"], name="events_tenant_type_idx"),
            models.Index(fields=["type", "id"], name="events_type_idx"),
            # GET /events?actor=.
            models.Index(fields=["tenant", "actor", "id"], name="events_tenant_actor_idx"),
            models.Index(fields=["actor", "id"], name="events_actor_idx"),
            # GET /events?aggregate_type= alone.
            models.Index(
                fields=["tenant", "aggregate_type", "id"], name="events_tenant_agg_type_idx"
            ),
            models.Index(fields=["aggregate_type", "id"], name="events_agg_type_idx"),
            # occurred_after / occurred_before: the id of the last event before a time, or of
            # the first after it, one row read.
            models.Index(fields=["occurred_at", "id"], name="events_occurred_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.aggregate_type}:{self.aggregate_id}"
