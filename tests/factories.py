"""factory_boy factories of the whole suite: people, the catalog, workers and jobs.

They write rows only (no events, no outbox): to test what a service records, call the service.
The common ones are exposed as fixtures in ``tests/conftest.py`` and the apps' ``conftest.py``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import factory
from django.utils import timezone

from automation.authentication import hash_credential, new_credential
from automation.models import Automation, Worker
from identity.models import Tenant, User
from job.models import Job
from sector.models import Sector

DEFAULT_PASSWORD = "correct-horse-battery-staple-42"


# People


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Tenant {n}")
    slug = factory.Sequence(lambda n: f"tenant-{n}")


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    email = factory.Sequence(lambda n: f"person{n}@example.com")
    full_name = factory.Faker("name")
    tenant = factory.SubFactory(TenantFactory)
    role = User.Role.MEMBER

    @factory.post_generation
    def password(self, create, extracted, **kwargs):
        self.set_password(extracted or DEFAULT_PASSWORD)
        if create:
            self.save(update_fields=["password"])


class PlatformAdminFactory(UserFactory):
    tenant = None
    is_staff = True
    is_superuser = True


class ManagerFactory(UserFactory):
    role = User.Role.MANAGER


def bearer(user: User) -> str:
    """An ``Authorization`` header value for ``user``, without going through login."""
    from identity.tokens import issue_access_token

    return f"Bearer {issue_access_token(user).token}"


# The catalog


class SectorFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Sector

    name = factory.Sequence(lambda n: f"Sector {n}")
    slug = factory.Sequence(lambda n: f"sector-{n}")


class AutomationFactory(factory.django.DjangoModelFactory):
    """An automation alone, without its worker (``WorkerFactory`` or the subclass below add it)."""

    class Meta:
        model = Automation

    name = factory.Sequence(lambda n: f"Automation {n}")
    slug = factory.Sequence(lambda n: f"automation-{n}")
    sector = factory.SubFactory(SectorFactory)
    command = factory.LazyFunction(lambda: ["python", "-c", "print('ok')"])
    max_concurrency = 1


class WorkerFactory(factory.django.DjangoModelFactory):
    """A worker whose plain credential is on ``worker.credential`` (as shown once)."""

    class Meta:
        model = Worker
        skip_postgeneration_save = True

    automation = factory.SubFactory(AutomationFactory)
    credential_hash = factory.LazyFunction(lambda: uuid.uuid4().hex * 2)

    @factory.post_generation
    def credential(self, create, extracted, **kwargs):
        self.credential = extracted or new_credential()
        self.credential_hash = hash_credential(self.credential)
        self.credential_prefix = self.credential[:12]
        if create:
            self.save(update_fields=["credential_hash", "credential_prefix"])


class AutomationWithWorkerFactory(AutomationFactory):
    """An automation born with its worker, as the service creates it.

    The worker's plain credential is on ``automation.credential``; ``worker__<field>`` sets the
    worker's fields. Shares its sequences with ``AutomationFactory``, so slugs never collide.
    """

    class Meta:
        skip_postgeneration_save = True

    @factory.post_generation
    def worker(self, create, extracted, **kwargs):
        if not create:
            return
        self.credential = WorkerFactory(automation=self, **kwargs).credential


# Jobs


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    tenant = factory.SubFactory(TenantFactory)
    automation = factory.SubFactory(AutomationFactory)
    requested_by = factory.SubFactory(UserFactory, tenant=factory.SelfAttribute("..tenant"))
    params = factory.LazyFunction(dict)


class RunningJobFactory(JobFactory):
    status = Job.Status.RUNNING
    attempt = 1
    claim_token = factory.LazyFunction(uuid.uuid4)
    started_at = factory.LazyFunction(timezone.now)
    last_heartbeat_at = factory.SelfAttribute("started_at")
    lease_expires_at = factory.LazyAttribute(lambda job: job.started_at + timedelta(seconds=60))
