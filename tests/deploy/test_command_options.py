"""The commands' own options: a bad number, or an option the command would ignore, is a
usage error before anything starts (exit 2, the option named), never a daemon that runs
with it (``--interval nan`` made the scheduler call Redis unreachable) or without it."""

from __future__ import annotations

import sys

import pytest

from tests.deploy.test_settings_refusals import started_all


def command_line(value: object) -> str:
    return " ".join(value) if isinstance(value, list) else ""


def ran(*arguments: str) -> tuple[int, str]:
    """The command's (exit code, stderr); killed at the deadline: it did not refuse."""
    # Nothing here may reach a broker: a command that did not refuse finds none.
    command = [sys.executable, "manage.py", *arguments]
    return started_all({"it": command}, RABBITMQ_URL="amqp://guest:guest@127.0.0.1:1/%2F")["it"]


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (
            ["run_scheduler", "--interval", "nan"],
            "argument --interval: 'nan' is not a plain number (no unit) from 0.01",
        ),
        (
            ["watch_stuck_jobs", "--interval", "inf"],
            "argument --interval: 'inf' is not a plain number (no unit) from 0.01",
        ),
        (
            ["run_relay", "--interval", "1e12"],
            "argument --interval: '1e12' is not a plain number (no unit) from 0.01 to 1000000000",
        ),
        (
            ["run_worker", "--concurrency", "100000"],
            "argument --concurrency: '100000' is not a whole number from 1 to 1000",
        ),
        (
            ["run_worker", "--automation", "greeter", "--poll-interval", "0"],
            "argument --poll-interval: '0' is not a plain number (no unit) from 0.05",
        ),
        (
            ["run_worker", "--automation", "greeter", "--idle-timeout", "-1"],
            "argument --idle-timeout: '-1' is not a plain number (no unit) from 0",
        ),
        (
            ["setup_broker", "--wait", "nan"],
            "argument --wait: 'nan' is not a plain number (no unit) from 0",
        ),
        (
            ["setup_broker", "--automation", "-5", "--wait", "0"],
            "argument --automation: '-5' is not a whole number from 1",
        ),
        (
            ["dead_letters", "--limit", "0"],
            "argument --limit: '0' is not a whole number from 1",
        ),
    ],
    ids=command_line,
)
def test_a_bad_number_is_a_usage_error(arguments, said):
    code, stderr = ran(*arguments)
    assert code == 2, stderr
    assert said in stderr


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        # A task worker has no hub to poll nor idle exit: it ran as if not given them.
        (["run_worker", "--poll-interval", "1"], "--poll-interval applies only with --automation"),
        (
            ["run_worker", "--queues", "default", "--idle-timeout", "60"],
            "--idle-timeout applies only with --automation",
        ),
        # An automation's worker runs its own automation's jobs, one at a time.
        (
            ["run_worker", "--automation", "greeter", "--queues", "critical"],
            "--queues applies only without --automation",
        ),
        (
            ["run_worker", "--automation", "greeter", "--concurrency", "2"],
            "--concurrency applies only without --automation",
        ),
    ],
    ids=command_line,
)
def test_an_option_the_worker_would_ignore_is_refused(arguments, said):
    code, stderr = ran(*arguments)
    assert code == 1, stderr
    assert stderr.strip().splitlines()[-1] == f"CommandError: {said}"
