"""``run_relay`` as a daemon: the flag, --once, the wake signal, Redis down, SIGTERM,
and the periodic tasks it enqueues."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from outbox.models import PlatformOutboxMessage
from outbox.services import dispatch
from relay.management.commands.run_relay import Command
from relay.models import RelaySchedule
from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import process_environment, wait_until_it_handles

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_relay_refuses_to_start_without_the_relay_flag(settings):
    settings.RELAY_ENABLED = False
    with pytest.raises(CommandError, match="HUBDOMMED_RELAY=true"):
        call_command("run_relay", "--once", stdout=StringIO())


def test_run_relay_once_drains_what_is_due_and_exits(rabbit):
    with transaction.atomic():
        run_ids = [dispatch("maintenance.purge", {"n": n}) for n in range(5)]
    out = StringIO()

    call_command("run_relay", "--once", stdout=out)

    # The hourly purge was due at the first start, so it went out too.
    assert "relay stopped: 6 messages sent" in out.getvalue()
    received = {env["run_id"] for _, env in rabbit.take_all("maintenance")}
    assert {str(r) for r in run_ids} < received and len(received) == 6


def test_with_redis_down_the_relay_keeps_sweeping_and_says_so_once(settings, caplog, rabbit):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    settings.RELAY_SWEEP_INTERVAL = 0.05
    command = Command(stdout=StringIO(), stderr=StringIO())
    with transaction.atomic():
        run_id = dispatch("maintenance.purge", {})

    for _ in range(3):
        command.wait_for_signal()
        command.drain()

    assert caplog.text.count("Redis unreachable") == 1
    assert str(run_id) in {env["run_id"] for _, env in rabbit.take_all("maintenance")}


def relay_environment(settings, **extra) -> dict[str, str]:
    return process_environment(settings, BROKER="rabbitmq", HUBDOMMED_RELAY="true", **extra)


def test_the_daemon_wakes_on_a_commit_well_before_its_sweep_and_exits_0_on_sigterm(
    settings, rabbit
):
    sweep = 30.0
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_relay"],
        cwd=django_settings.BASE_DIR,
        env=relay_environment(settings, RELAY_SWEEP_INTERVAL=str(sweep)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The relay declares its queues at start, then sends the hourly purge (due at the
        # first start); once that has arrived, the relay is idle on BLPOP.
        wait_until(
            lambda: rabbit.exists("maintenance") or process.poll() is not None,
            timeout=20,
            interval=0.1,
            message="the relay to declare its queues",
        )
        assert rabbit.take_one("maintenance", timeout=20) is not None

        with transaction.atomic():
            run_id = dispatch("maintenance.purge", {"woken": True})
        received = rabbit.take_run("maintenance", run_id, timeout=sweep / 3)

        assert received is not None, "the relay waited for its sweep instead of the signal"
    finally:
        wait_until_it_handles(process, signal.SIGTERM)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)

    assert process.returncode == 0, err
    assert "relay stopped: 2 messages sent in 2 batches" in out
    batch_lines = [line for line in err.splitlines() if "relayed batch" in line]
    assert len(batch_lines) == 2, "one log line per batch"


def test_the_hourly_purge_is_enqueued_once_per_period_even_with_two_relays():
    start = threading.Barrier(2)
    results = []

    def relay():
        try:
            start.wait()
            results.append(Command().enqueue_due_schedules())
        finally:
            connection.close()

    threads = [threading.Thread(target=relay) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(results) == [[], ["maintenance.purge.hourly"]]
    assert Command().enqueue_due_schedules() == []
    purges = PlatformOutboxMessage.objects.filter(envelope__task="maintenance.purge")
    assert purges.count() == 1
    schedule = RelaySchedule.objects.get()
    assert schedule.last_run_id == purges.get().run_id
    assert schedule.next_due_at > timezone.now() + timedelta(minutes=59)


def test_a_relay_down_for_several_periods_enqueues_the_task_once_not_once_per_period():
    Command().enqueue_due_schedules()
    RelaySchedule.objects.update(next_due_at=timezone.now() - timedelta(hours=5, minutes=30))

    assert Command().enqueue_due_schedules() == ["maintenance.purge.hourly"]
    assert Command().enqueue_due_schedules() == []

    assert PlatformOutboxMessage.objects.filter(envelope__task="maintenance.purge").count() == 2
    next_due = RelaySchedule.objects.get().next_due_at
    # Still on the schedule's own slots: the next one is within the coming hour.
    assert timezone.now() < next_due <= timezone.now() + timedelta(hours=1)


def drop_other_database_connections() -> int:
    """What a database restart does to every other process: their connections are gone."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def test_the_daemon_reconnects_after_the_database_drops_its_connection(settings, rabbit):
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_relay"],
        cwd=django_settings.BASE_DIR,
        env=relay_environment(settings, RELAY_SWEEP_INTERVAL="0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The hourly purge due at the first start: the relay is up and connected.
        wait_until(
            lambda: rabbit.exists("maintenance") or process.poll() is not None,
            timeout=20,
            interval=0.1,
            message="the relay to declare its queues",
        )
        assert rabbit.take_one("maintenance", timeout=20) is not None
        assert drop_other_database_connections() >= 1

        with transaction.atomic():
            run_id = dispatch("maintenance.purge", {"after": "restart"})
        received = rabbit.take_run("maintenance", run_id, timeout=20)

        assert received is not None, "the relay never got its database connection back"
    finally:
        wait_until_it_handles(process, signal.SIGTERM)
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
