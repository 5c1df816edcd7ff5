"""A bad variable stops every process at its start with one line that names the variable
and says what it accepts: no traceback, no value read as something else, no hang.

The readings themselves (``common.env``) are checked in this process, against the real
environment; each entry point an operator starts (the daemons, the one-off commands,
gunicorn, uvicorn) as a real process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from common.env import Env

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Generous: a loaded machine takes seconds to import Django; a refusal comes before any
# connection, so only a process that does not refuse reaches this.
DEADLINE = 120

# --- the readings ---------------------------------------------------------------------------


@pytest.fixture
def variable(monkeypatch):
    def set_to(value: str) -> str:
        monkeypatch.setenv("HUBDOMMED_TEST_VALUE", value)
        return "HUBDOMMED_TEST_VALUE"

    return set_to


@pytest.mark.parametrize("value", ["5s", "5m", "1e3s", "0x10", "1,5", "five", "nan", "inf", ""])
def test_a_number_of_seconds_with_anything_else_in_it_is_refused(variable, value):
    # django-environ kept the digits alone: 5m was 5 seconds, 1e3s 13, 0x10 10.
    with pytest.raises(ImproperlyConfigured, match=r"HUBDOMMED_TEST_VALUE=.* is not a plain"):
        Env().float(variable(value), default=2.0, minimum=0.05)


@pytest.mark.parametrize(("value", "read"), [("2.5", 2.5), (" 7 ", 7.0), ("1e3", 1000.0)])
def test_a_plain_number_is_read_as_written(variable, value, read):
    assert Env().float(variable(value), default=2.0, minimum=0.05) == read


@pytest.mark.parametrize("value", ["10000000000", "1e20"])
def test_an_absurdly_large_number_is_refused(variable, value):
    # Past the clock's range a wait raises inside the daemon, long after its start.
    with pytest.raises(ImproperlyConfigured, match=r"up to|to 1000000000"):
        Env().float(variable(value), default=2.0)
    with pytest.raises(ImproperlyConfigured, match="to 1000000000"):
        Env().int(variable(value), default=2, minimum=0)


def test_a_bound_of_its_own_is_said_in_the_message(variable):
    with pytest.raises(ImproperlyConfigured) as refused:
        Env().int(variable("70000"), default=0, minimum=0, maximum=65535)
    assert str(refused.value) == (
        "HUBDOMMED_TEST_VALUE='70000' is not a whole number from 0 to 65535"
    )


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_boolean_is_refused_not_read_as_false(variable, value):
    # SESSION_COOKIE_SECURE= would otherwise turn secure cookies off without a word.
    with pytest.raises(ImproperlyConfigured, match="is not a boolean"):
        Env().bool(variable(value), default=True)


def test_an_unset_number_or_boolean_is_its_default(monkeypatch):
    monkeypatch.delenv("HUBDOMMED_TEST_VALUE", raising=False)
    assert Env().float("HUBDOMMED_TEST_VALUE", default=2.0, minimum=0.05) == 2.0
    assert Env().bool("HUBDOMMED_TEST_VALUE", default=True) is True


# --- the settings' own bounds, in a fresh process --------------------------------------------


def settings_read(**variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from common.env import settings_or_exit; settings_or_exit()"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "hubdommed.settings", **variables},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


@pytest.mark.parametrize(
    ("variables", "line"),
    [
        # Each past what the system it is handed to takes: a port, PostgreSQL's lock_timeout
        # (every daemon's connection refused, logged as "database unreachable" for ever),
        # SQS's long poll and visibility, a thread per slot.
        ({"METRICS_PORT": "70000"}, "METRICS_PORT='70000' is not a whole number from 0 to 65535"),
        (
            {"DB_LOCK_TIMEOUT": "99999999"},
            "DB_LOCK_TIMEOUT='99999999' is not a whole number from 0 to 2147483",
        ),
        (
            {"WORKER_SQS_WAIT_SECONDS": "30"},
            "WORKER_SQS_WAIT_SECONDS='30' is not a whole number from 0 to 20",
        ),
        (
            {"WORKER_VISIBILITY_TIMEOUT": "86400"},
            "WORKER_VISIBILITY_TIMEOUT='86400' is not a plain number (no unit) from 0 to 43200",
        ),
        (
            {"WORKER_CONCURRENCY": "100000"},
            "WORKER_CONCURRENCY='100000' is not a whole number from 1 to 1000",
        ),
        (
            {"RELAY_SWEEP_INTERVAL": "5m"},
            "RELAY_SWEEP_INTERVAL='5m' is not a plain number (no unit) from 0.05 to 1000000000",
        ),
        ({"DEBUG": ""}, "DEBUG='' is not a boolean"),
        # Empty, each is silently something else: every interface, RabbitMQ's default
        # exchange (refused at its first declare), an SQS endpoint without a region.
        ({"METRICS_HOST": ""}, "METRICS_HOST='' is empty: leave it unset or give a value"),
        ({"RABBITMQ_EXCHANGE": " "}, "RABBITMQ_EXCHANGE=' ' is empty"),
        ({"AWS_REGION": ""}, "AWS_REGION='' is empty"),
        ({"REDIS_KEY_PREFIX": ""}, "REDIS_KEY_PREFIX='' is empty"),
        (
            {
                "DEBUG": "false",
                "SECRET_KEY": "a-production-key-of-enough-length-0123456789-abcdefghijklmnop",
                "WEBHOOK_SECRET_KEYS": "YnVpbGQtb25seS1ub3QtYS1zZWNyZXQtMDEyMzQ1Njc=",
                "SESSION_COOKIE_SECURE": "",
            },
            "SESSION_COOKIE_SECURE='' is not a boolean",
        ),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else "",
)
def test_a_setting_past_its_bounds_stops_the_start_with_one_line(variables, line):
    result = settings_read(**variables)
    assert result.returncode == 1, result.stderr
    (only,) = result.stderr.strip().splitlines()
    assert only.startswith(f"cannot start: {line}")


# --- every entry point ------------------------------------------------------------------------

ENTRY_POINTS = {
    "run_relay": [sys.executable, "manage.py", "run_relay"],
    "run_worker": [sys.executable, "manage.py", "run_worker"],
    "run_scheduler": [sys.executable, "manage.py", "run_scheduler"],
    "watch_stuck_jobs": [sys.executable, "manage.py", "watch_stuck_jobs"],
    "setup_broker": [sys.executable, "manage.py", "setup_broker", "--wait", "0"],
    "dead_letters": [sys.executable, "manage.py", "dead_letters"],
    "migrate": [sys.executable, "manage.py", "migrate", "--check"],
    "gunicorn": [str(BIN / "gunicorn"), "-c", "gunicorn.conf.py", "hubdommed.wsgi:application"],
    "uvicorn": [str(BIN / "uvicorn"), "hubdommed.asgi:application", "--port", "0"],
}


def started_all(commands: dict[str, list[str]], **variables: str) -> dict[str, tuple]:
    """Each command started at once with these variables; its (exit code, stderr) once it
    ended (killed at the deadline: it did not refuse)."""
    env = {**os.environ, "HUBDOMMED_RELAY": "true", "PORT": "0", **variables}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    processes = {
        name: subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, command in commands.items()
    }
    ended = {}
    for name, process in processes.items():
        try:
            _, stderr = process.communicate(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
        ended[name] = (process.returncode, stderr)
    return ended


def test_every_entry_point_refuses_a_bad_variable_with_one_line():
    ended = started_all(ENTRY_POINTS, WORKER_CONCURRENCY="four")
    expected = "cannot start: WORKER_CONCURRENCY='four' is not a whole number from 1 to 1000"
    for name, (code, stderr) in ended.items():
        assert (code, stderr.strip()) == (1, expected), name


@pytest.mark.parametrize("value", ["0", "1001"])
def test_gunicorn_refuses_a_web_concurrency_it_cannot_serve_with(value):
    # 0 was a master that listened and never answered. (A negative value, or one that is
    # no number at all, gunicorn refuses itself, before it reads any configuration file.)
    ((code, stderr),) = started_all(
        {"gunicorn": ENTRY_POINTS["gunicorn"]}, WEB_CONCURRENCY=value
    ).values()
    assert code == 1
    assert stderr.strip() == (
        f"cannot start: WEB_CONCURRENCY={value!r} is not a whole number from 1 to 1000"
    )
