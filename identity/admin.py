"""The Django admin for tenants and users, run by platform admins.

Changes that have a domain event (creating a tenant, deactivating a tenant or a
user) go through the same services as the API, so the admin records the same
events. Nothing can be deleted here; deactivation is an action.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth.admin import GroupAdmin as DjangoGroupAdmin
from django.contrib.auth.models import Group

from common.admin import (
    BadQueriesRefused,
    DeactivatableAdmin,
    EditedAsShownForm,
    NeverDeletedAdmin,
    deactivate_action,
)
from identity import services
from identity.models import RefreshToken, Tenant, User


@admin.register(Tenant)
class TenantAdmin(DeactivatableAdmin, admin.ModelAdmin):
    form = EditedAsShownForm
    list_display = ("name", "slug", "is_active", "created_at", "deactivated_at")
    list_filter = ("is_active",)
    search_fields = ("name", "slug")
    readonly_fields = ("is_active", "created_at", "updated_at", "deactivated_at")
    actions = ("deactivate",)
    # A refusal here (already deactivated) leaves things as they were: a warning.
    refusal_level = messages.WARNING

    def get_readonly_fields(self, request, obj=None):
        # The slug names the tenant in URLs and messages: fixed once created.
        return (*self.readonly_fields, "slug") if obj else self.readonly_fields

    def save_model(self, request, obj, form, change) -> None:
        if change:
            # Renamed only when the name was changed on the page (not set back to the one
            # the page showed, when someone renamed it meanwhile).
            if "name" in form.changed_data:
                services.tenant_rename(tenant=obj, name=obj.name, actor=request.user)
        else:
            created = services.tenant_create(name=obj.name, slug=obj.slug, actor=request.user)
            obj.pk = created.pk

    deactivate = deactivate_action(
        "Deactivate the selected tenants",
        lambda tenant, actor: services.tenant_deactivate(tenant=tenant, actor=actor),
    )


@admin.register(User)
class UserAdmin(DeactivatableAdmin, admin.ModelAdmin):
    """Users are registered through the API (password rules, the UserRegistered event)."""

    form = EditedAsShownForm
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
    # A refusal here (already deactivated, or oneself) leaves things as they were: a warning.
    refusal_level = messages.WARNING

    def has_add_permission(self, request) -> bool:
        return False

    def save_model(self, request, obj, form, change) -> None:
        # What was changed on the page only: the rest stays as it is now.
        changed = {f: form.cleaned_data[f] for f in ("full_name", "role") if f in form.changed_data}
        services.user_update(user=obj, **changed, actor=request.user)

    deactivate = deactivate_action(
        "Deactivate the selected users",
        lambda user, actor: services.user_deactivate(user=user, actor=actor),
    )


@admin.register(RefreshToken)
class RefreshTokenAdmin(NeverDeletedAdmin, admin.ModelAdmin):
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


# Django's own admin of permission groups, with the refusals every admin of the site has
# (``BadQueriesRefused``): a list query the database cannot run is not a 500 there either.
admin.site.unregister(Group)


@admin.register(Group)
class GroupAdmin(BadQueriesRefused, DjangoGroupAdmin):
    pass
