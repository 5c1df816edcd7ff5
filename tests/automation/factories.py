from __future__ import annotations

import factory

from automation.authentication import hash_credential, new_credential
from automation.models import Automation, Worker
from tests.sector.factories import SectorFactory


class AutomationFactory(factory.django.DjangoModelFactory):
    """An automation with its worker, as rows (no events). The credential is on ``.credential``."""

    class Meta:
        model = Automation
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"Automation {n}")
    slug = factory.Sequence(lambda n: f"automation-{n}")
    sector = factory.SubFactory(SectorFactory)
    command = factory.LazyFunction(lambda: ["python", "-c", "print('ok')"])

    @factory.post_generation
    def worker(self, create, extracted, **kwargs):
        if not create:
            return
        credential = new_credential()
        self.credential = credential
        Worker.objects.create(
            automation=self,
            credential_hash=hash_credential(credential),
            credential_prefix=credential[:12],
            **kwargs,
        )
