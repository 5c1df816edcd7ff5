"""The Django admin for tenants and users, run by platform admins.

Changes that have a domain event (creating a tenant, deactivating a tenant or a
user) go through the same services as the API, so the admin records the same
events. Nothing can be deleted here; deactivation is an action.
"""

from __future__ import annotations

from django.contrib import admin, messages

from common.errors import DomainError
from identity import services
from identity.models import RefreshToken, Tenant, User


class NoDelete:
    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


def _deactivate_each(modeladmin, request, queryset, deactivate) -> None:
    done = 0
    for obj in queryset:
        try:
            deactivate(obj)
        except DomainError as exc:
            modeladmin.message_user(request, f"{obj}: {exc.message}", messages.WARNING)
        else:
            done += 1
    if done:
        modeladmin.message_user(request, f"{done} deactivated.", messages.SUCCESS)


@admin.register(Tenant)
class TenantAdmin(NoDelete, admin.ModelAdmin):
    list_display = ("name", "slug", "is_active", "created_at", "deactivated_at")
    list_filter = ("is_active",)
    search_fields = ("name", "slug")
    readonly_fields = ("is_active", "created_at", "updated_at", "deactivated_at")
    actions = ("deactivate",)

    def get_readonly_fields(self, request, obj=None):
        # The slug names the tenant in URLs and messages: fixed once created.
        return (*self.readonly_fields, "slug") if obj else self.readonly_fields

    def has_change_permission(self, request, obj=None) -> bool:
        # A deactivated tenant is kept as it was: shown, not edited.
        return super().has_change_permission(request, obj) and (obj is None or obj.is_active)

    def save_model(self, request, obj, form, change) -> None:
        if change:
            services.tenant_rename(tenant=obj, name=obj.name, actor=request.user)
        else:
            created = services.tenant_create(name=obj.name, slug=obj.slug, actor=request.user)
            obj.pk = created.pk

    @admin.action(description="Deactivate the selected tenants")
    def deactivate(self, request, queryset) -> None:
        _deactivate_each(
            self,
            request,
            queryset,
            lambda tenant: services.tenant_deactivate(tenant=tenant, actor=request.user),
        )


@admin.register(User)
class UserAdmin(NoDelete, admin.ModelAdmin):
    """Users are registered through the API (password rules, the UserRegistered event)."""

    list_display = ("email", "full_name", "tenant", "role", "is_active", "is_staff", "last_login")
    list_filter = ("is_active", "role", "is_staff", "tenant")
    search_fields = ("email", "full_name")
    list_select_related = ("tenant",)
    fields = (
        "email",
        "full_name",
        "tenant",
        "role",
        "is_active",
        "is_staff",
        "last_login",
        "created_at",
        "deactivated_at",
    )
    readonly_fields = (
        "email",
        "tenant",
        "is_active",
        "is_staff",
        "last_login",
        "created_at",
        "deactivated_at",
    )
    actions = ("deactivate",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return super().has_change_permission(request, obj) and (obj is None or obj.is_active)

    def save_model(self, request, obj, form, change) -> None:
        services.user_update(user=obj, full_name=obj.full_name, role=obj.role, actor=request.user)

    @admin.action(description="Deactivate the selected users")
    def deactivate(self, request, queryset) -> None:
        _deactivate_each(
            self,
            request,
            queryset,
            lambda user: services.user_deactivate(user=user, actor=request.user),
        )


@admin.register(RefreshToken)
class RefreshTokenAdmin(NoDelete, admin.ModelAdmin):
    """Read-only: who holds sessions, and why they ended. Never the token itself."""

    list_display = ("id", "user", "family", "created_at", "expires_at", "used_at", "revoked_at")
    list_filter = ("revoke_reason",)
    search_fields = ("user__email", "family")
    list_select_related = ("user",)
    exclude = ("token_hash",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
