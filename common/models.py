"""Model plumbing the modules share (abstract only: nothing here has a table)."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from django.db import models
from django.db.models import Q
from django.utils import timezone

from common.errors import Conflict


def choices_check(table: str, field: str, choices: type[models.Choices]) -> models.CheckConstraint:
    """The database's own guard that ``field`` holds one of ``choices``: a row written around
    the model (raw SQL, a migration) cannot hold a value the code does not know."""
    return models.CheckConstraint(
        condition=Q(**{f"{field}__in": choices.values}), name=f"{table}_{field}_check"
    )


class Deactivatable(models.Model):
    """A row that is deactivated, never deleted: the rows pointing at it keep their meaning.

    Deactivation is one way (nothing comes back) and happens once: deactivating an
    inactive row is refused, as is any change to it that calls ``ensure_active``.
    """

    is_active = models.BooleanField(default=True)
    deactivated_at = models.DateTimeField(null=True, blank=True)

    # The refusal of a change to a deactivated row (a ``Conflict``).
    inactive_message: ClassVar[str]
    inactive_code: ClassVar[str]
    # The refusal of deactivating it again, when it says more than the one above.
    already_inactive_message: ClassVar[str | None] = None
    already_inactive_code: ClassVar[str | None] = None

    class Meta:
        abstract = True

    def ensure_active(self, *, message: str | None = None) -> None:
        """Refuse a change to a deactivated row (``message`` says which change, if given)."""
        if not self.is_active:
            raise Conflict(message or self.inactive_message, code=self.inactive_code)

    def deactivate(self, *, now: datetime | None = None) -> None:
        if not self.is_active:
            raise Conflict(
                self.already_inactive_message or self.inactive_message,
                code=self.already_inactive_code or self.inactive_code,
            )
        self.is_active = False
        self.deactivated_at = now or timezone.now()
