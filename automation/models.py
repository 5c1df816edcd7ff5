"""Automations and their workers: born together, deactivated together."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.lookups import Exact
from django.utils import timezone

from common.errors import Conflict
from common.models import Deactivatable, Timestamped

# What a person sets on an automation (the API and the admin alike), and where its worker's
# machine is.
AUTOMATION_FIELDS = (
    "name",
    "slug",
    "description",
    "sector",
    "max_concurrency",
    "command",
    "timeout_seconds",
    "max_attempts",
    "params_schema",
)
MACHINE_FIELDS = ("provider", "machine_id", "region")


class Automation(Timestamped, Deactivatable):
    """Something a tenant can run: a command executed by the automation's own worker."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=120, unique=True)
    description = models.TextField(blank=True, default="")
    sector = models.ForeignKey("sector.Sector", on_delete=models.PROTECT, related_name="+")
    # How many jobs of this automation may run at the same time (the claim enforces it).
    max_concurrency = models.PositiveIntegerField(default=1)
    # The argument list the worker executes (never a shell string).
    command = models.JSONField()
    timeout_seconds = models.PositiveIntegerField(default=3600)
    # How many times a job may be attempted when its worker is lost mid-run.
    max_attempts = models.PositiveIntegerField(default=1)
    # JSON Schema the job parameters must satisfy; null accepts any JSON object.
    params_schema = models.JSONField(null=True, blank=True)

    # A deactivated automation is read-only: its jobs and events keep their meaning.
    inactive_message = "The automation is not active."
    inactive_code = "automation_inactive"

    class Meta:
        db_table = "automations"
        ordering = ("name", "id")
        constraints = [
            models.CheckConstraint(
                condition=Q(max_concurrency__gte=1), name="automations_max_concurrency_at_least_one"
            ),
            models.CheckConstraint(
                condition=Q(timeout_seconds__gte=1), name="automations_timeout_at_least_one"
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1), name="automations_max_attempts_at_least_one"
            ),
            models.CheckConstraint(
                condition=Exact(
                    models.Func(
                        models.F("command"),
                        function="jsonb_typeof",
                        output_field=models.TextField(),
                    ),
                    models.Value("array"),
                ),
                name="automations_command_is_array",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Worker(Timestamped):
    """The dedicated machine of one automation, and the credential it calls the hub with."""

    class Provider(models.TextChoices):
        LOCAL = "local", "Local process"
        EC2 = "ec2", "Amazon EC2"

    class Status(models.TextChoices):
        OFFLINE = "offline"
        STARTING = "starting"
        ONLINE = "online"
        STOPPING = "stopping"
        DEACTIVATED = "deactivated"

    id = models.BigAutoField(primary_key=True)
    automation = models.OneToOneField(Automation, on_delete=models.PROTECT, related_name="worker")
    provider = models.CharField(max_length=16, choices=Provider.choices, default=Provider.LOCAL)
    machine_id = models.CharField(max_length=200, blank=True, default="")
    region = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OFFLINE)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # sha256 of the credential; the credential itself is shown once and never stored.
    credential_hash = models.CharField(max_length=64, unique=True)
    # The first characters of the credential, to tell credentials apart in the admin.
    credential_prefix = models.CharField(max_length=16, blank=True, default="")
    credential_rotated_at = models.DateTimeField(null=True, blank=True)
    is_active = models.BooleanField(default=True)

    class Meta:
        db_table = "workers"
        constraints = [
            models.CheckConstraint(
                condition=Q(provider__in=["local", "ec2"]), name="workers_provider_check"
            ),
            models.CheckConstraint(
                condition=Q(
                    status__in=["offline", "starting", "online", "stopping", "deactivated"]
                ),
                name="workers_status_check",
            ),
        ]

    def __str__(self) -> str:
        return f"worker of {self.automation_id} ({self.provider})"

    def machine(self) -> tuple[str, str, str]:
        return (self.provider, self.machine_id, self.region)

    def register_machine(self, *, provider: str, machine_id: str, region: str) -> bool:
        """Point the worker at a machine; True when it is a different machine than before.

        A new machine starts over as ``offline``: nothing is known about it yet.
        """
        if not self.is_active:
            raise Conflict("The worker is not active.", code="worker_inactive")
        if (provider, machine_id, region) == self.machine():
            return False
        self.provider, self.machine_id, self.region = provider, machine_id, region
        self.status = self.Status.OFFLINE
        self.last_seen_at = None
        return True

    def set_credential(self, credential: str, digest: str) -> None:
        """Keep only the hash (and a short prefix to tell credentials apart)."""
        self.credential_hash = digest
        self.credential_prefix = credential[:12]
        self.credential_rotated_at = timezone.now()

    def deactivate(self) -> None:
        if not self.is_active:
            raise Conflict("The worker is not active.", code="worker_inactive")
        self.is_active = False
        self.status = self.Status.DEACTIVATED

    # A worker is a principal of its own for DRF (request.user is the Worker).
    is_authenticated = True
    is_anonymous = False
