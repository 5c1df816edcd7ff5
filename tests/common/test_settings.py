"""A bad setting stops the process at start-up with a message naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start(
    env_overrides: dict[str, str], *, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Set Django up in a fresh process with these variables changed (or ``unset``)."""
    env = {k: v for k, v in os.environ.items() if k not in unset} | env_overrides
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "hubdommed.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RELAY_SWEEP_INTERVAL", "soon"),
        ("WORKER_CONCURRENCY", "0"),
        ("WORKER_PREFETCH_PER_SLOT", "0"),
        ("BROKER", "kafka"),
        ("DEBUG", "maybe"),
        ("DATABASE_URL", "mysql://localhost/x"),
        ("REDIS_URL", "localhost:6379"),
    ],
)
def test_a_bad_value_names_the_variable(variable, value):
    result = start({variable: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert variable in result.stderr


def test_a_webhook_retry_longer_than_the_outbox_takes_is_refused_at_start_up():
    result = start({"OUTBOX_MAX_DELAY_SECONDS": "3600", "WEBHOOK_RETRY_DELAYS": "5,7200"})
    assert result.returncode != 0
    assert "WEBHOOK_RETRY_DELAYS" in result.stderr and "OUTBOX_MAX_DELAY_SECONDS" in result.stderr


def test_production_refuses_to_start_without_a_secret_key():
    result = start({"DEBUG": "false"}, unset=("SECRET_KEY",))
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_the_defaults_start():
    result = start({})
    assert result.returncode == 0, result.stderr


def test_the_system_checks_pass_in_a_fresh_process():
    # The checks read the REST framework settings first: an import cycle among the
    # classes they name (parser, pagination) shows here and nowhere in a warmed-up suite.
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "hubdommed.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
