"""The admin's front page as a console: what is wrong now, each figure linking to its list.

Against the real database, RabbitMQ and Redis; a broker or a Redis that is away is a
closed port, and one that hangs is a listening socket that never answers.
"""

from __future__ import annotations

import html
import re
import socket
import threading
import uuid
from datetime import timedelta

import pika
import pytest
from django.contrib.auth.models import Permission
from django.db import transaction
from django.utils import timezone

from broker import get_transport, topology
from common.metrics import Heartbeat
from outbox.models import OutboxMessage, PlatformOutboxMessage, TaskRun
from outbox.services import dispatch
from schedule.services import schedule_create, schedule_pause
from tests.broker_queues import delete_queues
from tests.factories import AutomationFactory, UserFactory
from tests.ports import free_port
from webhook.models import WebhookEndpoint
from webhook.services import endpoint_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_site(client, platform_admin):
    client.force_login(platform_admin)
    return client


@pytest.fixture
def rabbitmq(settings, exchange_name):
    """RabbitMQ under this test's own queue prefix, its queues deleted at the end."""
    settings.BROKER = "rabbitmq"
    settings.QUEUE_PREFIX = f"{settings.QUEUE_PREFIX}console-{uuid.uuid4().hex[:6]}-"
    settings.RABBITMQ_EXCHANGE = exchange_name
    transport = get_transport()
    try:
        transport.setup_topology()
    finally:
        transport.close()
    yield settings
    delete_queues(settings.RABBITMQ_URL)


def figures(response) -> dict[str, tuple[str, str]]:
    """Each figure of the console: label -> (value, the link it leads to)."""
    assert response.status_code == 200, response.content[:500]
    found = {}
    rows = re.findall(
        r'<tr class="console-figure[^"]*" data-label="([^"]+)">(.*?)</tr>',
        response.content.decode(),
        re.S,
    )
    for label, row in rows:
        value = re.search(r'<td class="figure-value">(?:<a href="([^"]*)">)?([^<]*)', row)
        found[html.unescape(label)] = (value.group(2), html.unescape(value.group(1) or ""))
    return found


def listed(client, url: str) -> int:
    response = client.get(url)
    assert response.status_code == 200, url
    return len(response.context["cl"].result_list)


def park_a_dead_letter(settings, queue: str = "maintenance") -> None:
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        connection.channel().basic_publish(
            "",
            topology.dead_letter_queue_name(queue),
            b'{"run_id": "x", "task": "maintenance.purge", "payload": {}}',
            pika.BasicProperties(message_id=str(uuid.uuid4())),
        )
    finally:
        connection.close()


def test_each_figure_counts_what_its_link_lists(admin_site, rabbitmq, tenant, platform_admin):
    with transaction.atomic():
        dispatch("machines.power_on", {"automation_id": 1}, tenant=tenant)
        dispatch("machines.power_on", {"automation_id": 2}, tenant=tenant, delay=600)
        failed = dispatch("maintenance.purge", {})
        retrying = dispatch("maintenance.purge", {})
    OutboxMessage.objects.update(created_at=timezone.now() - timedelta(minutes=30))
    PlatformOutboxMessage.objects.filter(run_id=failed).update(sent_at=timezone.now())
    TaskRun.objects.filter(run_id=failed).update(status="failed")
    TaskRun.objects.filter(run_id=retrying).update(status="retrying")
    failing = endpoint_create(
        tenant=tenant, url="https://hooks.example.com/a", event_types=["JobFailed"], actor=None
    )
    endpoint_create(
        tenant=tenant, url="https://hooks.example.com/b", event_types=["JobFailed"], actor=None
    )
    WebhookEndpoint.objects.filter(pk=failing.pk).update(failing_since=timezone.now())
    automation = AutomationFactory()
    schedule = schedule_create(
        tenant=tenant,
        actor=None,
        automation_id=automation.pk,
        name="nightly export",
        cron="0 6 * * *",
    )
    schedule_pause(tenant=tenant.pk, schedule_id=schedule.pk)
    park_a_dead_letter(rabbitmq)
    park_a_dead_letter(rabbitmq)

    response = admin_site.get("/admin/")
    shown = figures(response)

    assert shown["outbox_messages unsent"][0] == "2"
    assert shown["platform_outbox_messages unsent"][0] == "1"
    assert shown["runs failed"][0] == "1" and shown["runs retrying"][0] == "1"
    assert shown["maintenance dead letters"][0] == "2"
    assert shown["default dead letters"][0] == "0"
    assert shown["endpoints failing"][0] == "1"
    assert shown["endpoints disabled"][0] == "0"
    assert shown["schedules paused"][0] == "1"
    for label in (
        "outbox_messages unsent",
        "platform_outbox_messages unsent",
        "runs failed",
        "runs retrying",
        "endpoints failing",
        "schedules paused",
    ):
        value, url = shown[label]
        assert listed(admin_site, url) == int(value), label
    assert shown["maintenance dead letters"][1] == "/admin/dead-letters/?queue=maintenance"
    dead_letters = admin_site.get(shown["maintenance dead letters"][1]).content.decode()
    assert dead_letters.count('class="dead-letter"') == 2
    page = response.content.decode()
    # The backlog's age, and the paused schedule with its reason and a link to it.
    assert "2 due" not in page and "1 due; the oldest waits 30" in page
    assert re.search(r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page)
    assert f'href="/admin/schedule/schedule/{schedule.pk}/change/">nightly export: ' in page
    # A box's title leads to the whole subject's page.
    assert '<a class="section" href="/admin/dead-letters/">Dead letters</a>' in page
    # Nothing to look at is not an alarm; a count above zero is.
    assert re.search(r'class="console-figure alarming" data-label="runs failed"', page)
    assert re.search(r'class="console-figure" data-label="default dead letters"', page)


def test_each_daemons_last_heartbeat_is_shown_and_a_silent_one_stands_out(admin_site):
    Heartbeat("relay").beat()
    Heartbeat("scheduler").beat()

    shown = figures(admin_site.get("/admin/"))

    assert shown["relay"][0] == "0\xa0minutes ago"
    assert shown["scheduler"][0] == "0\xa0minutes ago"
    assert shown["worker"][0] == "never seen"
    assert shown["monitor"][0] == "never seen"
    page = admin_site.get("/admin/").content.decode()
    assert 'class="console-figure alarming" data-label="worker"' in page
    assert 'class="console-figure" data-label="relay"' in page


def test_a_broker_that_is_away_makes_the_dead_letters_unavailable_not_an_error(
    admin_site, settings
):
    settings.BROKER = "rabbitmq"
    settings.RABBITMQ_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"

    response = admin_site.get("/admin/")

    assert figures(response)["dead letters"] == ("unavailable", "/admin/dead-letters/")
    assert "the broker cannot be reached" in response.content.decode()


@pytest.fixture
def silent_broker():
    """A port that takes connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", free_port()))
    server.listen(8)
    taken: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                taken.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in taken:
        conn.close()
    server.close()


def test_a_broker_that_hangs_costs_the_page_a_bounded_wait(
    admin_site, settings, silent_broker, monkeypatch
):
    monkeypatch.setattr("worker.console.TIMEOUT", 0.3)
    settings.BROKER = "rabbitmq"
    settings.RABBITMQ_URL = f"amqp://guest:guest@127.0.0.1:{silent_broker}/%2F"

    response = admin_site.get("/admin/")

    assert figures(response)["dead letters"][0] == "unavailable"
    assert "the broker did not answer within 0.3 s" in response.content.decode()


def test_redis_away_makes_the_heartbeats_unavailable_not_an_error(admin_site, settings):
    caches = {alias: dict(config) for alias, config in settings.CACHES.items()}
    caches["default"]["LOCATION"] = f"redis://127.0.0.1:{free_port()}/0"
    settings.CACHES = caches

    shown = figures(admin_site.get("/admin/"))

    assert shown["relay"][0] == "unavailable"


def test_staff_see_only_the_figures_of_what_they_may_view(client):
    staff = UserFactory(tenant=None, is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_taskrun"))
    client.force_login(staff)

    shown = figures(client.get("/admin/"))

    assert set(shown) == {"runs failed", "runs retrying"}


def test_a_daemons_cycle_is_its_heartbeat_on_the_console(admin_site):
    from io import StringIO

    from django.core.management import call_command

    call_command("watch_stuck_jobs", "--once", stdout=StringIO())

    assert figures(admin_site.get("/admin/"))["monitor"][0] == "0\xa0minutes ago"


def test_a_heartbeat_with_redis_away_costs_the_daemon_nothing_but_the_record(settings):
    from common.heartbeats import heartbeats_last

    caches = {alias: dict(config) for alias, config in settings.CACHES.items()}
    caches["default"]["LOCATION"] = f"redis://127.0.0.1:{free_port()}/0"
    settings.CACHES = caches

    Heartbeat("relay").beat()  # does not raise

    assert heartbeats_last() is None
