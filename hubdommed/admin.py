"""The admin site: the operators' console of Hub DomMed.

Besides the modules' models it serves the dead-letter queues' page (``worker.admin``),
listed on the index with the models. "View site" leads to the API's documentation.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import path, reverse, reverse_lazy

from worker.admin import dead_letters_view


class HubAdminSite(admin.AdminSite):
    site_header = "Hub DomMed"
    site_title = "Hub DomMed admin"
    index_title = "Operations"
    site_url = reverse_lazy("api-docs")

    def get_urls(self):
        own = [
            path(
                "dead-letters/",
                self.admin_view(lambda request: dead_letters_view(self, request)),
                name="dead-letters",
            ),
        ]
        return own + super().get_urls()

    def get_app_list(self, request, app_label=None):
        apps = super().get_app_list(request, app_label)
        if request.user.is_superuser and app_label in (None, "worker"):
            url = reverse("admin:dead-letters", current_app=self.name)
            apps.append(
                {
                    "name": "Broker",
                    "app_label": "worker",
                    "app_url": url,
                    "has_module_perms": True,
                    "models": [
                        {
                            "name": "Dead letters",
                            "object_name": "DeadLetter",
                            "perms": {"view": True},
                            "admin_url": url,
                            "add_url": None,
                            "view_only": True,
                        }
                    ],
                }
            )
        return apps
