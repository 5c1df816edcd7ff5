"""The benchmarks' own database: created when missing, then migrated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from django.core.management import call_command

ROOT = Path(__file__).resolve().parent.parent


def ensure_migrated() -> None:
    """Create ``DATABASE_URL``'s database if it does not exist, and migrate it."""
    subprocess.run([sys.executable, "scripts/ensure_database.py"], cwd=ROOT, check=True)
    call_command("migrate", verbosity=0)
