"""Reads of tenants and users, for the identity API and for other modules.

What a caller may see is decided here: a platform admin sees every tenant user,
a tenant manager only the people of their own tenant. Anything outside that is
"not found", so another tenant's user is a 404 and never a 403.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from common.errors import InvalidInput, NotFound
from common.queries import narrowed
from identity.emails import normalize_email
from identity.models import Tenant, User


def tenant_list(*, is_active: bool | None = None, search: str = "") -> QuerySet[Tenant]:
    queryset = Tenant.objects.all()
    if is_active is not None:
        queryset = queryset.filter(is_active=is_active)
    if search:
        queryset = queryset.filter(Q(name__icontains=search) | Q(slug__icontains=search))
    return queryset


def tenant_is_active(tenant_id: int) -> bool:
    return Tenant.objects.filter(pk=tenant_id, is_active=True).exists()


def user_may_log_in(user_id: int) -> bool:
    """Whether the user is active and, for a tenant's person, their tenant is too: what a
    request of theirs would be authenticated against (a long stream asks it again)."""
    return (
        User.objects.filter(pk=user_id, is_active=True)
        .filter(Q(tenant__isnull=True) | Q(tenant__is_active=True))
        .exists()
    )


def tenant_ids_deactivated(*, before: datetime) -> list[int]:
    """The tenants deactivated before ``before``: what is left of their jobs is ended."""
    return list(
        Tenant.objects.filter(is_active=False, deactivated_at__lt=before)
        .order_by("id")
        .values_list("id", flat=True)
    )


def tenant_for_admin(tenant_id: int) -> Tenant:
    tenant = Tenant.objects.filter(pk=tenant_id).first()
    if tenant is None:
        raise NotFound("No such tenant.")
    return tenant


def user_get_by_email(email: str) -> User | None:
    """The user of ``email``, however it is spelled (compared in the normal form)."""
    return User.objects.select_related("tenant").filter(email=normalize_email(email)).first()


def users_visible_to(caller: User) -> QuerySet[User]:
    """Tenant users the caller may manage: all of them for a platform admin, else their tenant's."""
    queryset = User.objects.select_related("tenant").filter(tenant__isnull=False)
    if caller.is_platform_admin:
        return queryset
    if caller.tenant_id is not None and caller.role == User.Role.MANAGER:
        return queryset.filter(tenant_id=caller.tenant_id)
    return queryset.none()


def user_list(
    *,
    caller: User,
    is_active: bool | None = None,
    search: str = "",
    tenant_id: int | None = None,
) -> QuerySet[User]:
    queryset = narrowed(users_visible_to(caller), tenant_id=tenant_id, is_active=is_active)
    if search:
        queryset = queryset.filter(
            Q(full_name__icontains=search) | Q(email__contains=normalize_email(search))
        )
    return queryset.order_by("email", "id")


def user_for_caller(*, caller: User, user_id: int) -> User:
    user = users_visible_to(caller).filter(pk=user_id).first()
    if user is None:
        raise NotFound("No such user.")
    return user


def tenant_for_registration(*, caller: User, tenant_id: int | None) -> Tenant:
    """The tenant a caller registers a user into: any for an admin, their own for a manager."""
    if caller.is_platform_admin:
        if tenant_id is None:
            raise InvalidInput(details={"tenant": ["A platform admin must name the tenant."]})
        return tenant_for_admin(tenant_id)
    if tenant_id is not None and tenant_id != caller.tenant_id:
        raise NotFound("No such tenant.")
    return caller.tenant
