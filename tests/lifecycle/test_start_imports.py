"""What a daemon's start does not import: each is CPU paid by every process start (the
daemons, their restarts, the tests' own processes), for code only other processes run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
import django
django.setup()
from django.core.management import load_command_class
load_command_class({app!r}, {command!r})
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize(
    ("app", "command"),
    [
        ("worker", "run_worker"),
        ("relay", "run_relay"),
        ("job", "watch_stuck_jobs"),
        ("schedule", "run_scheduler"),
    ],
)
def test_a_daemon_starts_without_the_schema_generator_or_the_ec2_client(app, command):
    loaded = subprocess.run(
        [sys.executable, "-c", PROBE.format(app=app, command=command)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    modules = set(json.loads(loaded.stdout.splitlines()[-1]))
    # drf-spectacular builds the OpenAPI schema, which only the API serves; boto3 drives
    # EC2 machines (and SQS, whose transport imports it when it is the broker).
    assert "drf_spectacular.extensions" not in modules
    assert "boto3" not in modules
