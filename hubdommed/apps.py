from django.contrib.admin import autodiscover
from django.contrib.admin.apps import SimpleAdminConfig
from django.contrib.admin.checks import check_admin_app, check_dependencies
from django.core import checks


class HubAdminConfig(SimpleAdminConfig):
    """``django.contrib.admin`` with the project's own site (``hubdommed.admin``).

    The apps' ``admin`` modules are imported by the URLconf (``hubdommed.urls``), which only
    the servers load, not when Django starts: importing them (and the services, selectors
    and serializers they import) was three fifths of every process's ``django.setup()``,
    paid by each daemon and command that never shows an admin page. The admin's system
    checks import them first, so that they still see every registered model.
    """

    default_site = "hubdommed.admin.HubAdminSite"

    def ready(self) -> None:
        checks.register(check_dependencies, checks.Tags.admin)
        checks.register(_check_admin_modules, checks.Tags.admin)


def _check_admin_modules(app_configs, **kwargs):
    autodiscover()
    return check_admin_app(app_configs, **kwargs)
