"""Seed a scenario's database through the code's own services (run as a subprocess, with the
scenario's environment): a tenant, a person and their access token, an automation with its
worker, printed as one JSON line; or runs of the scenarios' own task, as ``dispatch`` writes
them (their run ids printed).

    python -m tests.reliability.seed '{"command": ["/bin/true"], "max_attempts": 2}'
    python -m tests.reliability.seed --dispatch '[{"sleep": 0.2}, {"sleep": 8}]'
"""

from __future__ import annotations

import json
import sys
import uuid

import django
from django.db import transaction

django.setup()

from automation.services import automation_create  # noqa: E402
from identity.tokens import issue_access_token  # noqa: E402
from outbox.services import dispatch  # noqa: E402
from sector.services import sector_create  # noqa: E402
from tests.factories import PlatformAdminFactory, TenantFactory, UserFactory  # noqa: E402


def dispatch_runs(payloads: list[dict]) -> None:
    with transaction.atomic():
        run_ids = [str(dispatch("chaos.effect", payload)) for payload in payloads]
    print(json.dumps(run_ids))


def main() -> None:
    if sys.argv[1:2] == ["--dispatch"]:
        dispatch_runs(json.loads(sys.argv[2]))
        return
    fields = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    tag = uuid.uuid4().hex[:8]
    admin = PlatformAdminFactory(email=f"admin-{tag}@example.com")
    tenant = TenantFactory()
    person = UserFactory(tenant=tenant)
    sector = sector_create(name=f"Reliability {tag}", actor=admin)
    fields.setdefault("command", ["/bin/true"])
    fields.setdefault("max_concurrency", 4)
    created = automation_create(
        name=f"Chaos {tag}",
        slug=f"chaos-{tag}",
        sector_id=sector.id,
        provider="local",
        actor=admin,
        **fields,
    )
    print(
        json.dumps(
            {
                "token": issue_access_token(person).token,
                "automation_id": created.automation.id,
                "slug": created.automation.slug,
                "credential": created.credential,
            }
        )
    )


if __name__ == "__main__":
    main()
