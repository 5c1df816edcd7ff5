"""The operators' console in a real browser: headless Chromium (Debian's) through Playwright,
against the live server, the real database and RabbitMQ. Screenshots go to the test's
temporary folder."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest
from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone
from playwright.sync_api import Page, sync_playwright

from broker import get_transport, topology
from job.services import job_claim, job_create, job_fail
from outbox.models import TaskRun
from outbox.services import dispatch
from tests.broker_queues import delete_queues
from tests.factories import (
    DEFAULT_PASSWORD,
    AutomationWithWorkerFactory,
    PlatformAdminFactory,
    TenantFactory,
    UserFactory,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture
def chromium() -> Path:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: apt-get install chromium"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@contextmanager
def browser_page(chromium: Path) -> Iterator[Page]:
    """A page of headless Chromium. Playwright's sync API runs an event loop in this
    thread while open, which Django takes for an async context: no query in the block."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(chromium),
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.set_default_timeout(20_000)
            yield page
        finally:
            browser.close()


@pytest.fixture
def rabbitmq(settings, exchange_name):
    """RabbitMQ under this test's own queue prefix, its queues deleted at the end."""
    settings.BROKER = "rabbitmq"
    settings.QUEUE_PREFIX = f"{settings.QUEUE_PREFIX}browser-{uuid.uuid4().hex[:6]}-"
    settings.RABBITMQ_EXCHANGE = exchange_name
    transport = get_transport()
    try:
        transport.setup_topology()
    finally:
        transport.close()
    yield settings
    delete_queues(settings.RABBITMQ_URL)


def seed_failed_job() -> int:
    tenant = TenantFactory()
    automation = AutomationWithWorkerFactory(name="Nightly export")
    job, _ = job_create(
        tenant=tenant,
        automation_id=automation.pk,
        params={},
        requested_by=UserFactory(tenant=tenant),
    )
    claimed = job_claim(worker=automation.worker, job_id=job.pk)
    job_fail(
        worker=automation.worker,
        job_id=job.pk,
        claim_token=claimed.claim_token,
        error="the export ran out of disk",
        exit_code=2,
    )
    return job.pk


def seed_dead_letter() -> tuple[str, str]:
    """A failed run whose message the worker parked, with its failure context."""
    with transaction.atomic():
        run_id = str(dispatch("maintenance.purge", {}))
    run = TaskRun.objects.get(run_id=run_id)
    TaskRun.objects.filter(run_id=run_id).update(status="failed", receive_count=5)
    body = json.dumps({"run_id": run_id, "task": "maintenance.purge", "payload": {}})
    connection = pika.BlockingConnection(pika.URLParameters(django_settings.RABBITMQ_URL))
    try:
        connection.channel().basic_publish(
            "",
            topology.dead_letter_queue_name(run.queue),
            body.encode(),
            pika.BasicProperties(
                message_id=run_id,
                headers={
                    "x-error-type": "builtins.OSError",
                    "x-error-message": "disk quota exceeded",
                    "x-error-receive-count": "5",
                    "x-error-failed-at": "2026-12-01T10:00:00+00:00",
                    "x-error-worker": "worker-1:42",
                },
            ),
        )
    finally:
        connection.close()
    return run_id, run.queue


def test_an_operator_runs_the_hub_from_the_admin(live_server, chromium, rabbitmq, tmp_path):
    admin = PlatformAdminFactory(email="ops@example.com")
    failed_job = seed_failed_job()
    run_id, queue = seed_dead_letter()
    with browser_page(chromium) as page:
        operate(page, live_server.url, tmp_path, admin.email, failed_job, run_id, queue)

    assert TaskRun.objects.get(run_id=run_id).status == "queued"
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "01-index.png",
        "02-sector.png",
        "03-credential.png",
        "04-failed-job.png",
        "05-dead-letters.png",
        "06-sent-back.png",
    ]


def operate(
    page: Page, url: str, tmp_path: Path, email: str, failed_job: int, run_id: str, queue: str
) -> None:

    def shot(name: str) -> None:
        page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)

    # Log in as a platform admin.
    page.goto(f"{url}/admin/")
    page.fill("#id_username", email)
    page.fill("#id_password", DEFAULT_PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    assert "Hub DomMed" in page.inner_text("#site-name")
    assert page.get_attribute("#user-tools a[href='/api/docs/']", "href") == "/api/docs/"
    shot("01-index")

    # A sector.
    page.goto(f"{url}/admin/sector/sector/add/")
    page.fill("#id_name", "Logistics")
    page.fill("#id_description", "Routes and warehouses")
    assert page.input_value("#id_slug") == "logistics"  # filled in by the admin's script
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    shot("02-sector")

    # An automation with its worker; the credential is shown once.
    page.goto(f"{url}/admin/automation/automation/add/")
    assert page.input_value("#id_params_schema") == ""
    page.fill("#id_name", "Route planner")
    page.select_option("#id_sector", label="Logistics")
    page.fill("#id_command", '["python", "plan.py"]')
    page.select_option("#id_worker-0-provider", "ec2")
    page.fill("#id_worker-0-machine_id", "i-0123456789abcdef0")
    page.fill("#id_worker-0-region", "sa-east-1")
    page.click("input[name=_save]")
    warning = page.wait_for_selector(".messagelist .warning")
    credential = re.search(r"hdw_[A-Za-z0-9_\-]+", warning.inner_text())
    assert credential, warning.inner_text()
    shot("03-credential")
    page.reload()
    assert credential.group(0) not in page.content()

    # The failed job.
    page.goto(f"{url}/admin/job/job/?status__exact=failed")
    page.click(f"#result_list a[href*='/job/job/{failed_job}/change/']")
    page.wait_for_selector("text=the export ran out of disk")
    shot("04-failed-job")

    # The dead letter, found from the index, and sent back.
    page.goto(f"{url}/admin/")
    page.click("text=Dead letters")
    row = page.wait_for_selector(f"tr.dead-letter[data-run-id='{run_id}']")
    assert "disk quota exceeded" in row.inner_text()
    shot("05-dead-letters")
    row.query_selector("button[value=redrive]").click()
    page.wait_for_selector(".messagelist .success")
    assert f"1 message(s) of {queue} sent back" in page.inner_text(".messagelist")
    assert page.query_selector(f"tr.dead-letter[data-run-id='{run_id}']") is None
    shot("06-sent-back")


# What an operator reads on each page must be whole: these elements are never narrower
# than their content (a cut id, error or time), and no page scrolls sideways.
CUT_OFF = r"""(selectors) => {
    const cut = [];
    for (const selector of selectors) {
        for (const element of document.querySelectorAll(selector)) {
            if (element.scrollWidth > element.clientWidth + 1) {
                const text = element.textContent.trim().replace(/\s+/g, " ");
                cut.push(`${selector}: ${element.scrollWidth} > ${element.clientWidth}: `
                    + text.slice(0, 60));
            }
        }
    }
    const page = document.documentElement;
    if (page.scrollWidth > page.clientWidth + 1) {
        cut.push(`the page: ${page.scrollWidth} > ${page.clientWidth}`);
    }
    return cut;
}"""
MUST_BE_WHOLE = [
    "#console td",
    "#result_list td",
    "#result_list th",
    ".results",
    "fieldset .readonly",
    ".inline-group td",
    "#content-main",
]


def seed_console() -> dict[str, object]:
    """A job that failed, with its power-on run; a webhook delivery whose attempt found
    nobody listening, its run succeeded; a run failed with a long error; a paused schedule."""
    from schedule.services import schedule_create, schedule_pause
    from tests.ports import free_port
    from tests.webhook.conftest import due_deliver_runs, run_attempt
    from webhook.models import WebhookDelivery
    from webhook.services import endpoint_create

    tenant = TenantFactory()
    automation = AutomationWithWorkerFactory(name="Nightly export")
    endpoint_create(
        tenant=tenant,
        url=f"http://127.0.0.1:{free_port()}/hooks",
        event_types=["JobFailed"],
        actor=None,
    )
    job, _ = job_create(
        tenant=tenant,
        automation_id=automation.pk,
        params={"month": "2026-11"},
        requested_by=UserFactory(tenant=tenant),
    )
    claimed = job_claim(worker=automation.worker, job_id=job.pk)
    job_fail(
        worker=automation.worker,
        job_id=job.pk,
        claim_token=claimed.claim_token,
        error="the export ran out of disk",
        exit_code=2,
    )
    (row,) = due_deliver_runs()
    started = timezone.now()
    run_attempt(row)
    TaskRun.objects.filter(run_id=row.run_id).update(
        status="succeeded", started_at=started, finished_at=timezone.now()
    )
    with transaction.atomic():
        failing_run = dispatch("maintenance.purge", {})
    TaskRun.objects.filter(run_id=failing_run).update(
        status="failed",
        receive_count=5,
        last_error="psycopg.errors.DiskFull: could not extend file base/16384/2619: "
        "No space left on device; the purge stopped before its last batch\n"
        'Traceback (most recent call last):\n  File "outbox/tasks.py", line 40',
    )
    schedule = schedule_create(
        tenant=tenant, actor=None, automation_id=automation.pk, name="monthly", cron="0 6 1 * *"
    )
    schedule_pause(tenant=tenant.pk, schedule_id=schedule.pk)
    return {
        "job": job.pk,
        "delivery": WebhookDelivery.objects.get().pk,
        "deliver_run": str(row.run_id),
        "failing_run": str(failing_run),
    }


def test_every_console_page_shows_whole_what_an_operator_needs_at_1400_px(
    live_server, chromium, rabbitmq, tmp_path, settings
):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    admin = PlatformAdminFactory(email="console@example.com")
    seeded = seed_console()
    seed_dead_letter()
    job, delivery = seeded["job"], seeded["delivery"]
    pages = [
        ("01-console", "/admin/", ["Outbox backlog", "runs failed", "Daemons' last heartbeat"]),
        ("02-jobs", "/admin/job/job/", ["Nightly export", "failed"]),
        (
            "03-job",
            f"/admin/job/job/{job}/change/",
            ["the export ran out of disk", "its task runs", "correlation id", " UTC"],
        ),
        (
            "04-task-runs",
            "/admin/outbox/taskrun/",
            ["psycopg.errors.DiskFull", seeded["failing_run"]],
        ),
        (
            "05-task-run",
            f"/admin/outbox/taskrun/{seeded['failing_run']}/change/",
            ["No space left on device", "Traceback"],
        ),
        (
            "06-deliver-run",
            f"/admin/outbox/taskrun/{seeded['deliver_run']}/change/",
            [f"delivery {delivery} pending: attempt 1 failed"],
        ),
        ("07-tenant-outbox", "/admin/outbox/outboxmessage/", ["sent", "pending: due now"]),
        ("08-platform-outbox", "/admin/outbox/platformoutboxmessage/", ["pending: due now"]),
        ("09-deliveries", "/admin/webhook/webhookdelivery/", ["Webhook deliveries", f"job {job}"]),
        (
            "10-delivery",
            f"/admin/webhook/webhookdelivery/{delivery}/change/",
            ["attempts", "Connection refused"],
        ),
        ("11-endpoints", "/admin/webhook/webhookendpoint/", ["127.0.0.1"]),
        ("12-schedules", "/admin/schedule/schedule/", ["monthly", "paused"]),
        ("13-dead-letters", "/admin/dead-letters/", ["disk quota exceeded"]),
    ]
    problems: dict[str, list[str]] = {}
    with browser_page(chromium) as page:
        page.goto(f"{live_server.url}/admin/")
        page.fill("#id_username", admin.email)
        page.fill("#id_password", DEFAULT_PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_selector("#console")
        for name, path, texts in pages:
            page.goto(f"{live_server.url}{path}")
            page.wait_for_selector("#content")
            page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
            found = page.evaluate(CUT_OFF, MUST_BE_WHOLE)
            for text in texts:
                if not page.get_by_text(text, exact=False).first.is_visible():
                    found.append(f"not visible: {text}")
            if found:
                problems[name] = found

    assert sorted(p.name for p in tmp_path.glob("*.png")) == [f"{n}.png" for n, _, _ in pages]
    assert problems == {}, json.dumps(problems, indent=1)
