"""Small reusable DRF permissions: who may call an operation.

Object-level tenancy is enforced by scoping querysets to the caller's tenant
(another tenant's object is then a 404, never a 403 that would leak its
existence); these classes only say which kind of caller an operation is for.
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission


def is_person(user) -> bool:
    from identity.models import User

    return isinstance(user, User) and user.is_active


class IsPlatformAdmin(BasePermission):
    """Django staff without a tenant: runs the catalog and the tenants."""

    message = "Only platform admins may do this."

    def has_permission(self, request, view) -> bool:
        return is_person(request.user) and request.user.is_platform_admin


class IsTenantMember(BasePermission):
    """Any active person of an active tenant."""

    message = "Only people of a tenant may do this."

    def has_permission(self, request, view) -> bool:
        user = request.user
        return is_person(user) and user.tenant_id is not None and user.tenant.is_active


class IsTenantManager(IsTenantMember):
    """A manager of their tenant."""

    message = "Only tenant managers may do this."

    def has_permission(self, request, view) -> bool:
        return super().has_permission(request, view) and request.user.role == "manager"


class IsTenantManagerOrPlatformAdmin(BasePermission):
    """A manager of their tenant, or a platform admin: the readers of the events trail
    (``GET /api/v1/events``). Managers, not every member: the trail tells what each of the
    tenant's people did and carries the users' and webhook endpoints' events, which only
    managers may list (``/users``, ``/webhooks``)."""

    message = "Only tenant managers and platform admins may read the events."

    def has_permission(self, request, view) -> bool:
        return any(
            rule().has_permission(request, view) for rule in (IsPlatformAdmin, IsTenantManager)
        )


class IsPerson(BasePermission):
    """Any authenticated person (not a worker)."""

    # Authentication already refuses inactive people: this refuses nobody who got past it
    # (the schema documents no 403 for it).
    identity_only = True

    def has_permission(self, request, view) -> bool:
        return is_person(request.user)


def is_platform_admin(request) -> bool:
    """Whether the caller is a platform admin, for views that show them more than others."""
    return IsPlatformAdmin().has_permission(request, None)


class ReadsAndWrites:
    # A view mixin for views whose reads (safe methods) and writes are for different callers:
    # ``read_permission`` and ``write_permission``. No docstring: a docstring here would
    # become the description, in the schema, of every view without one of its own.
    read_permission: type[BasePermission]
    write_permission: type[BasePermission]

    def get_permissions(self):
        if self.request.method in SAFE_METHODS:
            return [self.read_permission()]
        return [self.write_permission()]


class ReadForPeopleWriteForAdmins(ReadsAndWrites):
    """Reads for any person, writes for platform admins."""

    # A view mixin (the catalog's views). Its docstring is the operations' description in
    # the schema of views without one of their own: it speaks to the API's readers.
    read_permission = IsPerson
    write_permission = IsPlatformAdmin


class ReadForMembersWriteForManagers(ReadsAndWrites):
    # The schedules' views: reads for the tenant's members, writes for its managers.
    read_permission = IsTenantMember
    write_permission = IsTenantManager
