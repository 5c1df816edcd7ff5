from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower

from common.models import Deactivatable, Timestamped


class Sector(Timestamped, Deactivatable):
    """A classification of automations (finance, logistics…). Deactivated, never deleted."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=120, unique=True)
    description = models.TextField(blank=True, default="")

    # Retired sectors are read-only: the trail of what they were stays true.
    inactive_message = "The sector is not active."
    inactive_code = "sector_inactive"

    class Meta:
        db_table = "sectors"
        ordering = ("name", "id")
        constraints = [
            # A retired name can be reused by a new sector.
            models.UniqueConstraint(
                Lower("name"), condition=Q(is_active=True), name="sectors_active_name_key"
            ),
        ]

    def __str__(self) -> str:
        return self.name
