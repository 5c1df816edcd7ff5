"""The sector catalog in the Django admin, saved through the same services as the API."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from common.admin import DeactivatableAdmin, EditedAsShownForm, adopt
from sector.models import Sector
from sector.selectors import sector_name_in_use
from sector.services import sector_create, sector_deactivate, sector_update


class SectorAdminForm(EditedAsShownForm):
    class Meta:
        model = Sector
        fields = ("name", "slug", "description")

    def clean_name(self) -> str:
        # The model form skips the active-name constraint (is_active is not on the form).
        # Only a changed name is checked: a sector is never refused over its own name.
        name = self.cleaned_data["name"]
        if "name" in self.changed_data and sector_name_in_use(name, excluding=self.instance.pk):
            raise forms.ValidationError("An active sector already has this name.")
        return name


@admin.register(Sector)
class SectorAdmin(DeactivatableAdmin, admin.ModelAdmin):
    form = SectorAdminForm
    list_display = ("name", "slug", "is_active", "created_at", "deactivated_at")
    list_filter = ("is_active",)
    search_fields = ("name", "slug", "description")
    prepopulated_fields = {"slug": ("name",)}
    fields = ("name", "slug", "description", "is_active", "created_at", "updated_at")
    readonly_fields = ("is_active", "created_at", "updated_at", "deactivated_at")
    actions = ("deactivate_selected",)

    def save_model(self, request, obj: Sector, form, change: bool) -> None:
        # The admin already runs this inside one transaction (changeform_view).
        if change:
            data = {field: form.cleaned_data[field] for field in form.changed_data}
            saved = sector_update(sector_id=obj.pk, data=data, actor=request.user)
        else:
            saved = sector_create(
                name=obj.name, slug=obj.slug, description=obj.description, actor=request.user
            )
        adopt(obj, saved)

    @admin.action(description="Deactivate selected sectors", permissions=["change"])
    def deactivate_selected(self, request, queryset) -> None:
        self.deactivate_each(
            request,
            queryset,
            lambda sector: sector_deactivate(sector_id=sector.pk, actor=request.user),
            done_message="Deactivated {count} sector(s).",
        )
