from django.contrib.admin.apps import AdminConfig


class HubAdminConfig(AdminConfig):
    """``django.contrib.admin`` with the project's own site (``hubdommed.admin``)."""

    default_site = "hubdommed.admin.HubAdminSite"
