from __future__ import annotations

from rest_framework.permissions import BasePermission

from automation.models import Worker


class IsWorker(BasePermission):
    """The caller is an automation's worker (``request.user`` is its ``Worker``)."""

    message = "Only an automation's worker may do this."
    # WorkerAuthentication admits active workers only: this refuses nobody who got past it
    # (the schema documents no 403 for it).
    identity_only = True

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, Worker) and request.user.is_active
