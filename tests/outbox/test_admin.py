"""The messaging half in the admin: outbox rows (send again), task runs (requeue a failed
one), the events trail (read-only). Changes go through ``outbox.operations``."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from common.errors import Conflict
from outbox.models import Event, OutboxMessage, PlatformOutboxMessage, TaskRun
from outbox.operations import outbox_send_again, task_run_requeue
from outbox.services import dispatch

pytestmark = pytest.mark.django_db

RUNS = "/admin/outbox/taskrun/"
PLATFORM_ROWS = "/admin/outbox/platformoutboxmessage/"
TENANT_ROWS = "/admin/outbox/outboxmessage/"
EVENTS = "/admin/outbox/event/"


@pytest.fixture
def admin_site(client, platform_admin):
    client.force_login(platform_admin)
    return client


def sent_run(task: str = "maintenance.purge", *, status: str, tenant=None):
    """A run dispatched, relayed (its row sent), and ended with ``status``."""
    with transaction.atomic():
        run_id = dispatch(task, {"automation_id": 1, "job_id": 1}, tenant=tenant)
    model = OutboxMessage if tenant is not None else PlatformOutboxMessage
    model.objects.filter(run_id=run_id).update(
        sent_at=timezone.now(), available_at=timezone.now() - timedelta(hours=1)
    )
    TaskRun.objects.filter(run_id=run_id).update(
        status=status, receive_count=5, last_error="ValueError: nope", finished_at=timezone.now()
    )
    return run_id, model.objects.get(run_id=run_id)


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


@pytest.mark.django_db(transaction=True)
def test_requeue_sends_a_failed_run_again_from_its_outbox_row(admin_site, redis_conn, settings):
    failed, row = sent_run(status=TaskRun.Status.FAILED)
    succeeded, done_row = sent_run(status=TaskRun.Status.SUCCEEDED)
    redis_conn.delete(settings.OUTBOX_WAKE_KEY)

    response = admin_site.post(
        RUNS, {"action": "requeue", "_selected_action": [failed, succeeded]}, follow=True
    )

    texts = messages_of(response)
    assert "1 run(s) requeued: the relay sends them next." in texts
    assert any("Only a failed run can be requeued." in text for text in texts)
    run = TaskRun.objects.get(run_id=failed)
    assert (run.status, run.receive_count, run.finished_at) == ("queued", 0, None)
    row.refresh_from_db()
    assert row.sent_at is None and row.available_at <= timezone.now()
    # The succeeded run and its row are left alone.
    assert TaskRun.objects.get(run_id=succeeded).status == "succeeded"
    done_row.refresh_from_db()
    assert done_row.sent_at is not None
    # The relay was woken after the commit.
    assert redis_conn.llen(settings.OUTBOX_WAKE_KEY) == 1


def test_a_failed_run_whose_row_was_purged_is_refused_with_the_way_out(db):
    failed, row = sent_run(status=TaskRun.Status.FAILED)
    PlatformOutboxMessage.objects.filter(pk=row.pk).delete()

    with pytest.raises(Conflict) as refused:
        task_run_requeue(run_id=failed)

    assert refused.value.code == "outbox_row_gone"
    assert TaskRun.objects.get(run_id=failed).status == "failed"


def test_the_runs_list_filters_by_task_and_status(admin_site, tenant):
    failed, _ = sent_run(status=TaskRun.Status.FAILED)
    sent_run(status=TaskRun.Status.SUCCEEDED)
    other, _ = sent_run("machines.power_on", status=TaskRun.Status.FAILED, tenant=tenant)

    response = admin_site.get(RUNS, {"task": "maintenance.purge", "status__exact": "failed"})

    assert response.status_code == 200
    assert [run.run_id for run in response.context["cl"].result_list] == [failed]
    response = admin_site.get(RUNS, {"status__exact": "failed"})
    assert {run.run_id for run in response.context["cl"].result_list} == {failed, other}
    assert "ValueError: nope" in response.content.decode()


@pytest.mark.parametrize("tenanted", [False, True], ids=["platform", "tenant"])
def test_send_again_makes_rows_of_either_table_due_now(admin_site, tenant, tenanted):
    run_id, row = sent_run(
        "machines.power_on" if tenanted else "maintenance.purge",
        status=TaskRun.Status.FAILED,
        tenant=tenant if tenanted else None,
    )
    url = TENANT_ROWS if tenanted else PLATFORM_ROWS

    listing = admin_site.get(url, {"pending": "no"})
    assert [r.pk for r in listing.context["cl"].result_list] == [row.pk]
    assert admin_site.get(url, {"pending": "yes"}).context["cl"].result_list.count() == 0

    response = admin_site.post(
        url, {"action": "send_again", "_selected_action": [row.pk]}, follow=True
    )

    assert "1 message(s) due now: the relay sends them next." in messages_of(response)
    row.refresh_from_db()
    assert row.sent_at is None and row.available_at <= timezone.now()
    # Its failed run starts afresh, or the worker would skip the copy as settled.
    assert TaskRun.objects.get(run_id=run_id).status == "queued"
    assert admin_site.get(url, {"pending": "yes"}).context["cl"].result_list.count() == 1


def test_send_again_leaves_a_run_that_succeeded_as_it_is(db):
    """The copy is sent, and the worker recognizes it as a duplicate: nothing runs twice."""
    run_id, row = sent_run(status=TaskRun.Status.SUCCEEDED)

    assert outbox_send_again(model=PlatformOutboxMessage, ids=[row.pk]) == 1

    row.refresh_from_db()
    assert row.sent_at is None
    assert TaskRun.objects.get(run_id=run_id).status == "succeeded"


def test_send_again_refuses_a_table_that_is_not_an_outbox(db):
    with pytest.raises(TypeError):
        outbox_send_again(model=TaskRun, ids=[1])


def test_the_events_trail_is_read_only(admin_site, tenant):
    event = Event.objects.create(
        type="JobCreated",
        aggregate_type="Job",
        aggregate_id="7",
        tenant=tenant,
        actor="system",
        payload={"job_id": 7},
        correlation_id="req-123",
    )

    listing = admin_site.get(EVENTS, {"q": "req-123"})
    assert [e.pk for e in listing.context["cl"].result_list] == [event.pk]
    page = admin_site.get(f"{EVENTS}{event.pk}/change/")
    assert page.status_code == 200
    assert "&quot;job_id&quot;: 7" in page.content.decode()
    assert 'name="_save"' not in page.content.decode()
    assert admin_site.get(f"{EVENTS}add/").status_code == 403
    assert admin_site.get(f"{EVENTS}{event.pk}/delete/").status_code == 403
    admin_site.post(f"{EVENTS}{event.pk}/change/", {"type": "Forged"})
    event.refresh_from_db()
    assert event.type == "JobCreated"


@pytest.mark.django_db(transaction=True)
def test_two_operators_requeueing_one_run_at_once_requeue_it_once():
    failed, _ = sent_run(status=TaskRun.Status.FAILED)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def requeue() -> None:
        try:
            barrier.wait(timeout=10)
            task_run_requeue(run_id=failed)
            outcomes.append("requeued")
        except Conflict as refusal:
            outcomes.append(refusal.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=requeue) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(outcomes) == ["requeued", "task_run_not_failed"]
    assert TaskRun.objects.get(run_id=failed).status == "queued"


@pytest.mark.parametrize("tenanted", [False, True], ids=["platform", "tenant"])
def test_outbox_rows_say_sent_or_why_not_yet_in_words_not_a_red_cross(admin_site, tenant, tenanted):
    sent_run(
        "machines.power_on" if tenanted else "maintenance.purge",
        status=TaskRun.Status.SUCCEEDED,
        tenant=tenant if tenanted else None,
    )
    with transaction.atomic():
        dispatch(
            "machines.power_on" if tenanted else "maintenance.purge",
            {"automation_id": 1},
            tenant=tenant if tenanted else None,
        )
        dispatch(
            "machines.power_on" if tenanted else "maintenance.purge",
            {"automation_id": 2},
            tenant=tenant if tenanted else None,
            delay=600,
        )
    url = TENANT_ROWS if tenanted else PLATFORM_ROWS

    page = admin_site.get(url).content.decode()

    assert '<span class="state-sent">sent</span>' in page
    assert '<span class="state-pending">pending: due now</span>' in page
    assert re.search(
        r'<span class="state-waiting">delayed: due \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC', page
    )
    assert "icon-no.svg" not in page and "icon-yes.svg" not in page


def test_a_runs_last_error_is_whole_on_its_page_and_its_first_line_in_the_list(admin_site):
    run_id, _ = sent_run(status=TaskRun.Status.FAILED)
    long_line = "OSError: " + "the disk is full " * 40
    error = f'{long_line}\nTraceback (most recent call last):\n  File "x.py", line 1'
    TaskRun.objects.filter(run_id=run_id).update(last_error=error)

    listing = admin_site.get(RUNS).content.decode()
    page = admin_site.get(f"{RUNS}{run_id}/change/").content.decode()

    assert long_line[:300] in listing and "…" in listing
    assert "Traceback" not in listing
    assert f'<pre class="error-text">{long_line}\nTraceback (most recent call last):' in page
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page)
