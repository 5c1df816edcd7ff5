from __future__ import annotations

import factory

from sector.models import Sector


class SectorFactory(factory.django.DjangoModelFactory):
    """A sector row as a fixture, without events (use the services to test events)."""

    class Meta:
        model = Sector

    name = factory.Sequence(lambda n: f"Sector {n}")
    slug = factory.Sequence(lambda n: f"sector-{n}")
