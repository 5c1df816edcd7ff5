"""Reads of sectors that other modules may call.

Who sees a retired sector is decided here: a platform admin sees every sector, everyone
else the active ones only. A retired sector is then "not found" for them, as if it had
never existed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import CharField, QuerySet, Value

from common.errors import NotFound
from common.queries import narrowed, searched
from sector.models import Sector, name_key

if TYPE_CHECKING:
    from identity.models import User


def sectors_visible_to(caller: User) -> QuerySet[Sector]:
    """Every sector for a platform admin; the active ones for everyone else."""
    if caller.is_platform_admin:
        return Sector.objects.all()
    return Sector.objects.filter(is_active=True)


def sectors_active() -> QuerySet[Sector]:
    """The sectors an automation may be filed under."""
    return Sector.objects.filter(is_active=True)


def sector_for_caller(*, caller: User, sector_id: int) -> Sector:
    sector = sectors_visible_to(caller).filter(pk=sector_id).first()
    if sector is None:
        raise NotFound("The sector does not exist.")
    return sector


def sector_list(*, caller: User, active: bool | None = None, search: str = "") -> QuerySet[Sector]:
    """The sectors ``caller`` may see; ``active`` narrows them (retired ones: admins only)."""
    return searched(narrowed(sectors_visible_to(caller), is_active=active), search)


def sector_name_in_use(name: str, *, excluding: int | None = None) -> bool:
    """Whether an active sector (other than ``excluding``) has this name, whatever its case.

    Compared exactly as the unique index ``sectors_active_name_key`` compares (the same
    key, the same scope: active sectors), in the database: what is "taken" here is what
    the index would refuse, no more and no less.
    """
    return (
        Sector.objects.filter(is_active=True)
        .exclude(pk=excluding)
        .alias(key=name_key("name"))
        .filter(key=name_key(Value(name, output_field=CharField())))
        .exists()
    )


def sector_lock_for_use(sector_id: int) -> Sector | None:
    """The sector, share-locked until the caller's transaction ends; None if there is none.

    An automation being filed under a sector takes this lock so that the sector cannot be
    deactivated between the check that it is active and the commit: ``sector_deactivate``
    takes ``FOR UPDATE``, which waits for every ``FOR SHARE`` holder (and vice versa), and
    then counts the automations that committed meanwhile. Shared, so that automations of
    one sector are still created in parallel.
    """
    return next(
        iter(Sector.objects.raw("SELECT * FROM sectors WHERE id = %s FOR SHARE", [sector_id])),
        None,
    )
