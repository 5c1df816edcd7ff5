"""The admin's dead-letter page, on both brokers: list with the failure context, send one
or all back (their runs queued afresh), purge one or all; and the command's purge."""

from __future__ import annotations

import json
import uuid
from io import StringIO

import pika
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import transaction

from broker import get_transport, topology
from broker.sqs.publisher import sqs_client
from outbox.models import TaskRun
from outbox.services import dispatch
from tests.factories import UserFactory
from tests.locks import Racer, another_session, until_another_waits
from tests.ports import free_port
from tests.worker.conftest import dead_letters

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "/admin/dead-letters/"


@pytest.fixture
def admin_site(client, platform_admin):
    client.force_login(platform_admin)
    return client


@pytest.fixture
def topology_ready(broker):
    transport = get_transport()
    try:
        transport.setup_topology()
    finally:
        transport.close()
    return broker


def park(broker: str, *, error: str = "the payload can never be processed") -> str:
    """A failed run of test.work, its message in the default queue's dead letters with the
    context the runtime attaches."""
    with transaction.atomic():
        run_id = str(dispatch("test.work", {"n": 1}))
    TaskRun.objects.filter(run_id=run_id).update(status="failed", receive_count=5)
    body = json.dumps({"run_id": run_id, "task": "test.work", "payload": {"n": 1}})
    context = {
        "x-error-type": "common.errors.InvalidInput",
        "x-error-message": error,
        "x-error-traceback": "Traceback (most recent call last): ...",
        "x-error-receive-count": "5",
        "x-error-failed-at": "2026-12-01T10:00:00+00:00",
        "x-error-worker": "host:1",
    }
    queue = topology.dead_letter_queue_name("default")
    if broker == "rabbitmq":
        connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
        try:
            connection.channel().basic_publish(
                "", queue, body.encode(), pika.BasicProperties(message_id=run_id, headers=context)
            )
        finally:
            connection.close()
    else:
        client = sqs_client()
        url = client.get_queue_url(QueueName=queue)["QueueUrl"]
        attributes = {k: {"DataType": "String", "StringValue": v} for k, v in context.items()}
        client.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=attributes)
    return run_id


def rows(response) -> list[str]:
    assert response.status_code == 200, response.content[:1000]
    return [row.run_id for box in response.context["parked"] for row in box.rows]


def test_the_page_lists_dead_letters_with_their_failure_context(admin_site, topology_ready):
    first, second = park(topology_ready), park(topology_ready, error="second failure")

    response = admin_site.get(PAGE, {"queue": "default"})

    assert sorted(rows(response)) == sorted([first, second])
    page = response.content.decode()
    assert "common.errors.InvalidInput" in page and "second failure" in page
    assert f"{topology.dead_letter_queue_name('default')}: 2 waiting" in page
    # Looking leaves them where they are.
    assert len(dead_letters("default")) == 2
    # The index lists the page beside the models.
    assert PAGE in admin_site.get("/admin/").content.decode()


def test_send_back_one_then_all(admin_site, topology_ready):
    first, second = park(topology_ready), park(topology_ready)

    response = admin_site.post(
        PAGE,
        {"action": "redrive", "destination": "default", "run_id": first, "shown": "default"},
        follow=True,
    )

    assert "1 message(s) of default sent back to their queue." in [
        str(m) for m in response.context["messages"]
    ]
    assert rows(response) == [second]
    run = TaskRun.objects.get(run_id=first)
    assert (run.status, run.receive_count) == ("queued", 0)
    assert TaskRun.objects.get(run_id=second).status == "failed"

    admin_site.post(PAGE, {"action": "redrive_all", "destination": "default"})

    assert dead_letters("default") == []
    assert TaskRun.objects.get(run_id=second).status == "queued"


def test_purge_one_and_purge_all_after_confirmation(admin_site, topology_ready):
    first, second, third = (park(topology_ready) for _ in range(3))

    admin_site.post(PAGE, {"action": "purge", "destination": "default", "run_id": first})
    assert sorted(letter.run_id for letter in dead_letters("default")) == sorted([second, third])
    assert TaskRun.objects.get(run_id=first).status == "failed"

    confirm = admin_site.post(PAGE, {"action": "purge_all", "destination": "default"})
    assert confirm.status_code == 200
    assert "Yes, purge them" in confirm.content.decode()
    assert len(dead_letters("default")) == 2

    admin_site.post(PAGE, {"action": "purge_all", "destination": "default", "confirmed": "on"})
    assert dead_letters("default") == []


def test_bad_input_is_a_message_not_an_error_page(admin_site, topology_ready):
    response = admin_site.get(PAGE, {"queue": "nowhere"})
    assert response.status_code == 200
    assert "unknown destination" in response.content.decode()

    response = admin_site.post(PAGE, {"action": "redrive", "destination": "nowhere"}, follow=True)
    assert response.status_code == 200
    assert any("unknown destination" in str(m) for m in response.context["messages"])

    response = admin_site.post(
        PAGE,
        {"action": "redrive", "destination": "default", "run_id": str(uuid.uuid4())},
        follow=True,
    )
    assert any("Nothing done" in str(m) for m in response.context["messages"])


def test_only_platform_admins_see_the_page(client, topology_ready):
    client.force_login(UserFactory(tenant=None, is_staff=True))
    assert client.get(PAGE).status_code == 403
    assert client.post(PAGE, {"action": "purge_all", "destination": "default"}).status_code == 403


def test_the_command_purges_too(topology_ready):
    first, second = park(topology_ready), park(topology_ready)
    out = StringIO()

    call_command("dead_letters", "--queue", "default", "--purge", first, stdout=out)

    assert f"purged {first} test.work from default" in out.getvalue()
    assert [letter.run_id for letter in dead_letters("default")] == [second]
    with pytest.raises(CommandError, match="give one of"):
        call_command("dead_letters", "--purge-all", "--requeue-all")

    call_command("dead_letters", "--queue", "default", "--purge-all", stdout=out)
    assert dead_letters("default") == []
    assert TaskRun.objects.get(run_id=second).status == "failed"


def test_a_broker_that_cannot_be_reached_is_said_on_the_page(admin_site, settings):
    settings.BROKER = "rabbitmq"
    port = free_port()  # a port nobody listens on
    settings.RABBITMQ_URL = f"amqp://guest:guest@127.0.0.1:{port}/%2F"

    page = admin_site.get(PAGE)
    assert page.status_code == 200
    assert "The broker cannot be reached" in page.content.decode()

    response = admin_site.post(
        PAGE, {"action": "redrive_all", "destination": "default"}, follow=True
    )
    assert response.status_code == 200
    assert any("The broker cannot be reached" in str(m) for m in response.context["messages"])


def waiting_in(destination: str) -> int:
    """How many messages wait in ``destination``'s own queue (not its dead letters)."""
    queue = topology.queue_name(destination)
    if settings.BROKER == "rabbitmq":
        connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
        try:
            return connection.channel().queue_declare(queue, passive=True).method.message_count
        finally:
            connection.close()
    client = sqs_client()
    url = client.get_queue_url(QueueName=queue)["QueueUrl"]
    attributes = client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"])


def test_a_message_sent_back_finds_its_run_already_queued(admin_site, topology_ready):
    """A worker may receive the message the moment it is back in its queue: its run must be
    queued by then, or the worker takes the copy for one of a failed run, skips it and
    acknowledges it, and the run is left queued with no message."""
    run_id = park(topology_ready)
    sender = Racer(
        "send-back",
        lambda: admin_site.post(
            PAGE, {"action": "redrive", "destination": "default", "run_id": run_id}
        ),
    )

    with another_session() as session:
        # The run's row held: the fresh start of the run waits here.
        session.execute("SELECT 1 FROM task_runs WHERE run_id = %s FOR UPDATE", [run_id])
        sender.start()
        assert until_another_waits(done=sender.finished)
        waiting_while_run_failed = waiting_in("default")
    response = sender.join()

    assert waiting_while_run_failed == 0
    assert response.status_code == 302
    run = TaskRun.objects.get(run_id=run_id)
    assert (run.status, run.receive_count) == ("queued", 0)
    assert waiting_in("default") == 1
    assert dead_letters("default") == []
