"""Model plumbing the modules share (abstract only: nothing here has a table)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

from django.db import IntegrityError, models, transaction
from django.db.models import Q
from django.utils import timezone

from common.errors import Conflict


def choices_check(table: str, field: str, choices: type[models.Choices]) -> models.CheckConstraint:
    """The database's own guard that ``field`` holds one of ``choices``: a row written around
    the model (raw SQL, a migration) cannot hold a value the code does not know."""
    return models.CheckConstraint(
        condition=Q(**{f"{field}__in": choices.values}), name=f"{table}_{field}_check"
    )


def violated_constraint(exc: IntegrityError) -> str:
    """The name of the constraint ``exc`` reports ("" when the driver does not say)."""
    return getattr(getattr(exc.__cause__, "diag", None), "constraint_name", "") or ""


def save_or_refuse(
    row: models.Model, refusal_for: Callable[[str], Exception | None], **save_kwargs: Any
) -> None:
    """Save ``row``; a violated constraint that ``refusal_for`` names (it is given the
    constraint's name) raises that refusal instead, any other one the IntegrityError.

    The checks made before saving are not enough under concurrency (two creations racing
    for one slug): the unique index decides, and the loser gets the same refusal.
    """
    try:
        with transaction.atomic():
            row.save(**save_kwargs)
    except IntegrityError as exc:
        refusal = refusal_for(violated_constraint(exc))
        if refusal is None:
            raise
        raise refusal from None


class Timestamped(models.Model):
    """When the row was created and when it was last saved."""

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


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
