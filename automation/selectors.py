"""Reads of automations and workers that other modules may call."""

from __future__ import annotations

from automation.models import Automation, Worker


def automation_get(automation_id: int, *, active_only: bool = False) -> Automation | None:
    queryset = Automation.objects.all()
    if active_only:
        queryset = queryset.filter(is_active=True)
    return queryset.filter(pk=automation_id).first()


def automation_get_by_slug(slug: str) -> Automation | None:
    return Automation.objects.filter(slug=slug).first()


def worker_of_automation(automation_id: int) -> Worker | None:
    return Worker.objects.filter(automation_id=automation_id).first()
