"""A daemon starts without the admin and the URLconf (hubdommed.apps), and the admin still
knows, and checks, every model it registers once the servers load the URLs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lifecycle.startup import DAEMONS

ROOT = Path(__file__).resolve().parents[2]

# Django set up as a daemon's manage.py sets it up, each daemon's command loaded and asked
# whether it runs the system checks (which load the URLconf), then: what is imported.
STARTED = """
import json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
import django
django.setup()
from django.apps import apps
from django.core.management import get_commands, load_command_class
checked = [
    name for name in sys.argv[1:]
    if load_command_class(get_commands()[name], name).requires_system_checks
]
ours = {config.name for config in apps.get_app_configs()}
loaded = sorted(
    module for module in sys.modules
    if module == "hubdommed.urls"
    or (module.endswith(".admin") and module.rsplit(".", 1)[0] in ours)
)
print(json.dumps({"checked": checked, "loaded": loaded}))
"""

# The admin's system checks, alone in a fresh process: what they saw registered.
CHECKED = """
import json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
import django
django.setup()
from django.contrib import admin
from django.core import checks
errors = checks.run_checks(tags=[checks.Tags.admin])
print(json.dumps({
    "errors": [str(error) for error in errors],
    "models": sorted(model._meta.label for model in admin.site._registry),
}))
"""


def run(script: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_daemon_starts_without_the_system_checks_the_urls_or_the_admin_modules():
    started = run(STARTED, *sorted(DAEMONS))
    assert started == {"checked": [], "loaded": []}


def test_the_admins_checks_still_see_every_model_it_registers():
    checked = run(CHECKED)
    assert checked["errors"] == []
    for label in ("job.Job", "automation.Automation", "webhook.WebhookEndpoint", "outbox.Event"):
        assert label in checked["models"], checked["models"]
