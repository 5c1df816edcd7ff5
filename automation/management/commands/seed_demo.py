"""``manage.py seed_demo``: demo data for a first run, created once (idempotent).

A tenant, its manager (with a password printed on creation and kept in
``var/demo-login.txt``; when that file is missing, or its password does not work on the
database being seeded, the demo manager gets a new one), a sector, and the ``greeter``
automation on the ``local`` provider, whose command is ``scripts/demo_automation.py``.
Everything goes through the modules' services, so the events are recorded as for any
other change.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from automation.selectors import automation_get_by_slug
from automation.services import automation_create
from identity.models import Tenant, User
from identity.selectors import user_get_by_email
from identity.services import tenant_create, user_register, user_set_password
from sector.models import Sector
from sector.services import sector_create

ACTOR = "system"
TENANT_SLUG = "demo"
MANAGER_EMAIL = "manager@demo.example"
SECTOR_SLUG = "demo"
AUTOMATION_SLUG = "greeter"


class Command(BaseCommand):
    help = "Create the demo tenant, manager, sector and automation when they are missing."

    @transaction.atomic
    def handle(self, *args, **options) -> None:
        login_file = Path(settings.DEMO_LOGIN_FILE)
        tenant = Tenant.objects.filter(slug=TENANT_SLUG).first() or tenant_create(
            name="Demo Organization", slug=TENANT_SLUG, actor=ACTOR
        )
        manager = user_get_by_email(MANAGER_EMAIL)
        if manager is None or not _file_logs_in(login_file, manager):
            # A new demo manager, or one whose password this checkout does not hold (the
            # database outlived the checkout, or the file was made for another database):
            # either way a fresh password, shown once.
            password = secrets.token_urlsafe(12)
            if manager is None:
                user_register(
                    tenant=tenant,
                    email=MANAGER_EMAIL,
                    password=password,
                    full_name="Demo Manager",
                    role=User.Role.MANAGER,
                    actor=ACTOR,
                )
            else:
                user_set_password(user=manager, password=password)
            login_file.parent.mkdir(parents=True, exist_ok=True)
            login_file.write_text(f"{MANAGER_EMAIL}\n{password}\n")
            login_file.chmod(0o600)
            self.stdout.write(f"demo manager: {MANAGER_EMAIL} password: {password}")
        else:
            self.stdout.write(f"demo manager: {MANAGER_EMAIL} (password in {login_file})")

        sector = Sector.objects.filter(slug=SECTOR_SLUG).first() or sector_create(
            name="Demo",
            slug=SECTOR_SLUG,
            description="Automations for trying the hub.",
            actor=ACTOR,
        )
        automation = automation_get_by_slug(AUTOMATION_SLUG)
        if automation is None:
            automation = automation_create(
                name="Greeter",
                slug=AUTOMATION_SLUG,
                description="Greets whoever the job's 'name' parameter names.",
                sector_id=sector.id,
                command=[
                    sys.executable,
                    str(Path(settings.BASE_DIR) / "scripts" / "demo_automation.py"),
                ],
                max_concurrency=2,
                timeout_seconds=300,
                params_schema={
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 100},
                        "sleep": {"type": "number", "minimum": 0, "maximum": 120},
                        "fail": {"type": "boolean"},
                    },
                    "additionalProperties": False,
                },
                provider="local",
                actor=ACTOR,
            ).automation
        self.stdout.write(f"demo automation: {automation.slug} (id {automation.id})")


def _file_logs_in(login_file: Path, manager: User) -> bool:
    """Whether the login file holds this database's demo manager and password."""
    try:
        email, password = login_file.read_text().split()
    except (FileNotFoundError, ValueError):
        return False
    return email.lower() == manager.email.lower() and manager.check_password(password)
