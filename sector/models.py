from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower, Upper

from common.models import Deactivatable, Timestamped


def name_key(expression):
    """What two sector names are compared by: ``lower(upper(name))`` in SQL.

    PostgreSQL's ``UPPER`` and ``LOWER`` each fold only some case pairs (``UPPER`` makes the
    final and the medial sigma, U+03C2 and U+03C3, one letter, and the dotless i, U+0131,
    one with i; ``LOWER`` does not; ``LOWER`` makes the Kelvin sign and ``K`` one, ``UPPER``
    does not): the two together fold both. The unique index and every check of a name
    compare this same key, so that a check never says "free" (or "taken") where the index
    says otherwise.
    """
    return Lower(Upper(expression))


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
            # A retired name can be reused by a new sector. Checked before saving by
            # ``sector.selectors.sector_name_in_use``, with the same key.
            models.UniqueConstraint(
                name_key("name"), condition=Q(is_active=True), name="sectors_active_name_key"
            ),
        ]

    def __str__(self) -> str:
        return self.name
