"""Reads of sectors that other modules may call."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from sector.models import Sector


def sector_get(sector_id: int, *, active_only: bool = False) -> Sector | None:
    queryset = Sector.objects.all()
    if active_only:
        queryset = queryset.filter(is_active=True)
    return queryset.filter(pk=sector_id).first()


def sector_list(*, active: bool | None = None, search: str = "") -> QuerySet[Sector]:
    queryset = Sector.objects.all()
    if active is not None:
        queryset = queryset.filter(is_active=active)
    if search:
        queryset = queryset.filter(
            Q(name__icontains=search) | Q(slug__icontains=search) | Q(description__icontains=search)
        )
    return queryset


def sector_name_in_use(name: str, *, excluding: int | None = None) -> bool:
    """Whether an active sector (other than ``excluding``) has this name, whatever its case."""
    return Sector.objects.exclude(pk=excluding).filter(is_active=True, name__iexact=name).exists()


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
