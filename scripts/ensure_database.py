"""Create the database named by DATABASE_URL when it does not exist yet (idempotent)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django
import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
django.setup()

from django.conf import settings  # noqa: E402


def main() -> None:
    db = settings.DATABASES["default"]
    params = {
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
    }
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]
        ).fetchone()
        if exists:
            return
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
        print(f"created database {db['NAME']}")


if __name__ == "__main__":
    main()
