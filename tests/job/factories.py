"""Factories for the catalog rows jobs need, and for jobs themselves."""

from __future__ import annotations

import uuid
from datetime import timedelta

import factory
from django.utils import timezone

from automation.authentication import hash_credential, new_credential
from automation.models import Automation, Worker
from job.models import Job
from sector.models import Sector
from tests.factories import TenantFactory, UserFactory


class SectorFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Sector

    name = factory.Sequence(lambda n: f"Sector {n}")
    slug = factory.Sequence(lambda n: f"sector-{n}")


class AutomationFactory(factory.django.DjangoModelFactory):
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
