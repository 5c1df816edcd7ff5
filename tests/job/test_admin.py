"""Jobs in the admin: filters to find them, read-only pages, cancel through the service."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from job.models import Job
from job.services import job_claim, job_create, job_fail, job_output_append
from outbox.models import Event
from tests.factories import AutomationWithWorkerFactory, UserFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/job/job/"


@pytest.fixture
def admin_site(client, platform_admin):
    client.force_login(platform_admin)
    return client


def create_job(tenant, automation) -> Job:
    job, _ = job_create(
        tenant=tenant,
        automation_id=automation.pk,
        params={},
        requested_by=UserFactory(tenant=tenant),
    )
    return job


def failed_job(tenant, automation) -> Job:
    job = create_job(tenant, automation)
    claimed = job_claim(worker=automation.worker, job_id=job.pk)
    return job_fail(
        worker=automation.worker,
        job_id=job.pk,
        claim_token=claimed.claim_token,
        error="exit 3",
        exit_code=3,
    )


def listed(response) -> set[int]:
    assert response.status_code == 200, response.content[:500]
    return {job.pk for job in response.context["cl"].result_list}


def test_the_list_filters_by_status_automation_tenant_and_age(admin_site, tenant, other_tenant):
    automation, other_automation = AutomationWithWorkerFactory(), AutomationWithWorkerFactory()
    failed = failed_job(tenant, automation)
    pending = create_job(tenant, automation)
    elsewhere = create_job(other_tenant, other_automation)
    old = create_job(tenant, automation)
    Job.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=2))

    assert listed(admin_site.get(CHANGELIST, {"status__exact": "failed"})) == {failed.pk}
    assert listed(admin_site.get(CHANGELIST, {"automation__id__exact": other_automation.pk})) == {
        elsewhere.pk
    }
    assert listed(admin_site.get(CHANGELIST, {"tenant__id__exact": other_tenant.pk})) == {
        elsewhere.pk
    }
    assert listed(admin_site.get(CHANGELIST, {"created_at_age": "gt1h"})) == {old.pk}
    assert listed(admin_site.get(CHANGELIST, {"created_at_age": "lt5m"})) == {
        failed.pk,
        pending.pk,
        elsewhere.pk,
    }


def test_a_job_page_is_read_only_and_shows_its_outcome(admin_site, tenant):
    job = failed_job(tenant, AutomationWithWorkerFactory())

    response = admin_site.get(f"{CHANGELIST}{job.pk}/change/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "exit 3" in page
    # Its trail is a click away.
    events = re.search(r'href="(/admin/outbox/event/\?[^"]+)">its events', page).group(1)
    trail = admin_site.get(events.replace("&amp;", "&"))
    assert {e.type for e in trail.context["cl"].result_list} == {
        "JobCreated",
        "JobStarted",
        "JobFailed",
    }
    assert 'name="_save"' not in page
    # Nothing is written by a post to the page either.
    assert admin_site.post(f"{CHANGELIST}{job.pk}/change/", {"status": "pending"}).status_code in (
        403,
        302,
    )
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert admin_site.get(f"{CHANGELIST}add/").status_code == 403
    assert admin_site.get(f"{CHANGELIST}{job.pk}/delete/").status_code == 403


def test_cancel_goes_through_the_service_and_records_its_event(admin_site, tenant, platform_admin):
    automation = AutomationWithWorkerFactory(max_concurrency=2)
    pending = create_job(tenant, automation)
    running = create_job(tenant, automation)
    job_claim(worker=automation.worker, job_id=running.pk)
    finished = failed_job(tenant, automation)

    response = admin_site.post(
        CHANGELIST,
        {"action": "cancel", "_selected_action": [pending.pk, running.pk, finished.pk]},
        follow=True,
    )

    texts = [str(message) for message in response.context["messages"]]
    assert "1 job(s) canceled." in texts
    assert any("1 running job(s) asked to stop" in text for text in texts)
    assert any(f"Job {finished.pk}: The job has already finished." in text for text in texts)
    pending.refresh_from_db()
    running.refresh_from_db()
    assert pending.status == Job.Status.CANCELED
    assert running.status == Job.Status.RUNNING and running.cancel_requested_at is not None
    (canceled,) = Event.objects.filter(type="JobCanceled", aggregate_id=str(pending.pk))
    assert canceled.actor == f"user:{platform_admin.pk}"


def test_staff_without_the_change_permission_cannot_cancel(client, tenant):
    staff = UserFactory(tenant=None, is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(staff)
    job = create_job(tenant, AutomationWithWorkerFactory())

    response = client.get(CHANGELIST)
    assert response.status_code == 200
    action_form = response.context["action_form"]
    assert action_form is None or "cancel" not in dict(action_form.fields["action"].choices)
    client.post(CHANGELIST, {"action": "cancel", "_selected_action": [job.pk]})
    job.refresh_from_db()
    assert job.status == Job.Status.PENDING


TIME_TO_THE_SECOND = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def test_a_job_page_shows_times_to_the_second_its_duration_ids_and_links(admin_site, tenant):
    automation = AutomationWithWorkerFactory()
    job = create_job(tenant, automation)
    claimed = job_claim(worker=automation.worker, job_id=job.pk)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=75))
    job_fail(
        worker=automation.worker,
        job_id=job.pk,
        claim_token=claimed.claim_token,
        error="exit 3",
        exit_code=3,
    )

    page = admin_site.get(f"{CHANGELIST}{job.pk}/change/").content.decode()

    # Created, started, finished: each to the second, with its zone.
    assert len(re.findall(TIME_TO_THE_SECOND, page)) >= 3
    assert re.search(r"1 min 1[5-9] s", page)  # its duration
    created = Event.objects.get(type="JobCreated", aggregate_id=str(job.pk))
    assert created.correlation_id and f"<code>{created.correlation_id}</code>" in page
    assert f"(id {tenant.pk})" in page and f"(id {automation.pk})" in page
    # Its task runs (the power-on its creation asked for) are a click away, and link back.
    runs = re.search(r'href="(/admin/outbox/taskrun/\?job=\d+)">its task runs', page).group(1)
    listed_runs = admin_site.get(runs).context["cl"].result_list
    assert {run.task for run in listed_runs} == {"machines.power_on"}
    run_page = admin_site.get(f"/admin/outbox/taskrun/{listed_runs[0].pk}/change/")
    assert f'href="/admin/job/job/{job.pk}/change/">job {job.pk}</a>' in run_page.content.decode()
    # And its webhook deliveries.
    assert f'href="/admin/webhook/webhookdelivery/?job={job.pk}">its webhook deliveries' in page
    # A finished job offers no Cancel.
    assert "Cancel this job" not in page


def test_the_cancel_button_of_a_jobs_page_cancels_through_the_service(
    admin_site, tenant, platform_admin
):
    job = create_job(tenant, AutomationWithWorkerFactory())
    page = admin_site.get(f"{CHANGELIST}{job.pk}/change/").content.decode()
    assert "Cancel this job" in page
    assert f'action="/admin/job/job/{job.pk}/cancel/"' in page

    response = admin_site.post(f"/admin/job/job/{job.pk}/cancel/", follow=True)

    assert "1 job(s) canceled." in [str(m) for m in response.context["messages"]]
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELED
    (canceled,) = Event.objects.filter(type="JobCanceled", aggregate_id=str(job.pk))
    assert canceled.actor == f"user:{platform_admin.pk}"
    assert "Cancel this job" not in response.content.decode()
    # A GET changes nothing.
    assert admin_site.get(f"/admin/job/job/{job.pk}/cancel/").status_code == 405


def test_a_running_job_canceled_from_the_list_shows_it_at_once(admin_site, tenant):
    automation = AutomationWithWorkerFactory()
    running = create_job(tenant, automation)
    job_claim(worker=automation.worker, job_id=running.pk)

    response = admin_site.post(
        CHANGELIST, {"action": "cancel", "_selected_action": [running.pk]}, follow=True
    )

    # The worker learns it at its next heartbeat; the list says it now.
    assert re.search(rf"running, cancel requested {TIME_TO_THE_SECOND}", response.content.decode())
    page = admin_site.get(f"{CHANGELIST}{running.pk}/change/").content.decode()
    assert "Cancel this job" not in page  # asked already


def test_staff_without_the_change_permission_get_no_cancel_button(client, tenant):
    staff = UserFactory(tenant=None, is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(staff)
    job = create_job(tenant, AutomationWithWorkerFactory())

    assert "Cancel this job" not in client.get(f"{CHANGELIST}{job.pk}/change/").content.decode()
    assert client.post(f"/admin/job/job/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.status == Job.Status.PENDING


# --- running again ----------------------------------------------------------------------


def test_run_again_goes_through_the_service_for_the_finished_jobs_only(
    admin_site, tenant, platform_admin
):
    automation = AutomationWithWorkerFactory()
    finished = failed_job(tenant, automation)
    pending = create_job(tenant, automation)

    response = admin_site.post(
        CHANGELIST, {"action": "rerun", "_selected_action": [finished.pk, pending.pk]}, follow=True
    )

    (new,) = Job.objects.filter(rerun_of=finished)
    texts = [str(message) for message in response.context["messages"]]
    assert f"1 job(s) run again, as job(s) {new.pk}." in texts
    assert any(f"Job {pending.pk}: The job has not finished" in text for text in texts)
    assert not Job.objects.filter(rerun_of=pending).exists()
    assert new.status == Job.Status.PENDING
    assert (new.tenant_id, new.automation_id, new.params) == (tenant.pk, automation.pk, {})
    assert new.requested_by_id == platform_admin.pk
    (created,) = Event.objects.filter(type="JobCreated", aggregate_id=str(new.pk))
    assert created.actor == f"user:{platform_admin.pk}"
    assert created.payload["rerun_of"] == finished.pk


def test_the_run_again_button_of_a_finished_jobs_page_opens_the_new_job(admin_site, tenant):
    automation = AutomationWithWorkerFactory()
    finished = failed_job(tenant, automation)
    page = admin_site.get(f"{CHANGELIST}{finished.pk}/change/").content.decode()
    assert "Run this job again" in page
    assert f'action="/admin/job/job/{finished.pk}/rerun/"' in page

    response = admin_site.post(f"/admin/job/job/{finished.pk}/rerun/")

    (new,) = Job.objects.filter(rerun_of=finished)
    assert response.status_code == 302
    assert response["Location"] == f"/admin/job/job/{new.pk}/change/"
    page = admin_site.get(response["Location"]).content.decode()
    # The new job links to the one it runs again, which lists its re-runs.
    assert f'<a href="/admin/job/job/{finished.pk}/change/">job {finished.pk}</a>' in page
    assert "Run this job again" not in page  # pending
    old_page = admin_site.get(f"{CHANGELIST}{finished.pk}/change/").content.decode()
    reruns = re.search(r'href="(/admin/job/job/\?rerun_of=\d+)">its re-runs', old_page).group(1)
    assert listed(admin_site.get(reruns)) == {new.pk}
    # A GET changes nothing.
    assert admin_site.get(f"/admin/job/job/{finished.pk}/rerun/").status_code == 405
    assert Job.objects.filter(rerun_of=finished).count() == 1


def test_a_jobs_run_again_form_sent_twice_creates_one_job(admin_site, tenant):
    finished = failed_job(tenant, AutomationWithWorkerFactory())
    page = admin_site.get(f"{CHANGELIST}{finished.pk}/change/").content.decode()
    (key,) = re.findall(r'name="submission" value="(\w+)"', page)

    first = admin_site.post(f"/admin/job/job/{finished.pk}/rerun/", {"submission": key})
    again = admin_site.post(f"/admin/job/job/{finished.pk}/rerun/", {"submission": key})

    (new,) = Job.objects.filter(rerun_of=finished)
    assert first["Location"] == again["Location"] == f"/admin/job/job/{new.pk}/change/"
    # The page shown again has a key of its own: its Run again is a new request.
    page = admin_site.get(f"{CHANGELIST}{finished.pk}/change/").content.decode()
    (other,) = re.findall(r'name="submission" value="(\w+)"', page)
    admin_site.post(f"/admin/job/job/{finished.pk}/rerun/", {"submission": other})
    assert Job.objects.filter(rerun_of=finished).count() == 2


def test_the_lists_run_again_sent_twice_runs_each_job_again_once(admin_site, tenant):
    automation = AutomationWithWorkerFactory()
    finished = [failed_job(tenant, automation) for _ in range(2)]
    key = admin_site.get(CHANGELIST).context["action_form"]["submission"].value()
    chosen = {"action": "rerun", "_selected_action": [job.pk for job in finished]}

    admin_site.post(CHANGELIST, {**chosen, "submission": key})
    response = admin_site.post(CHANGELIST, {**chosen, "submission": key}, follow=True)

    reruns = sorted(Job.objects.filter(rerun_of__in=finished).values_list("pk", flat=True))
    assert len(reruns) == 2
    texts = [str(message) for message in response.context["messages"]]
    assert any("This form was sent before" in text for text in texts), texts
    assert admin_site.get(CHANGELIST).context["action_form"]["submission"].value() != key


def test_run_again_is_refused_for_a_job_of_an_inactive_tenant_or_automation(
    admin_site, tenant, other_tenant
):
    automation = AutomationWithWorkerFactory()
    of_inactive_tenant = failed_job(other_tenant, automation)
    other_tenant.is_active = False
    other_tenant.save(update_fields=["is_active"])
    inactive_automation = AutomationWithWorkerFactory()
    of_inactive_automation = failed_job(tenant, inactive_automation)
    inactive_automation.is_active = False
    inactive_automation.save(update_fields=["is_active"])

    response = admin_site.post(
        CHANGELIST,
        {
            "action": "rerun",
            "_selected_action": [of_inactive_tenant.pk, of_inactive_automation.pk],
        },
        follow=True,
    )

    texts = [str(message) for message in response.context["messages"]]
    assert f"Job {of_inactive_tenant.pk}: The job's tenant is inactive." in texts
    assert f"Job {of_inactive_automation.pk}: The automation is inactive." in texts
    assert not Job.objects.filter(rerun_of__isnull=False).exists()


def test_staff_without_the_change_permission_cannot_run_a_job_again(client, tenant):
    staff = UserFactory(tenant=None, is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(staff)
    job = failed_job(tenant, AutomationWithWorkerFactory())

    response = client.get(CHANGELIST)
    action_form = response.context["action_form"]
    assert action_form is None or "rerun" not in dict(action_form.fields["action"].choices)
    client.post(CHANGELIST, {"action": "rerun", "_selected_action": [job.pk]})
    assert "Run this job again" not in client.get(f"{CHANGELIST}{job.pk}/change/").content.decode()
    assert client.post(f"/admin/job/job/{job.pk}/rerun/").status_code == 403
    assert not Job.objects.filter(rerun_of=job).exists()


def test_a_job_page_shows_the_end_of_the_output_its_worker_sent(admin_site, tenant, monkeypatch):
    monkeypatch.setattr("job.admin.ADMIN_OUTPUT_CHARS", 12)
    automation = AutomationWithWorkerFactory()
    job = create_job(tenant, automation)
    claimed = job_claim(worker=automation.worker, job_id=job.pk)
    for seq, text in enumerate(["early <b>\n", "late line\n"]):
        job_output_append(
            worker=automation.worker,
            job_id=job.pk,
            claim_token=claimed.claim_token,
            seq=seq,
            text=text,
        )

    page = admin_site.get(f"{CHANGELIST}{job.pk}/change/").content.decode()

    assert "[... 8 characters before ...]\n</span>&gt;\nlate line\n" in page


def test_a_finished_job_page_without_output_says_so(admin_site, tenant):
    # (An unfinished job's page keeps room for the output to come: test_admin_live_output.)
    job = failed_job(tenant, AutomationWithWorkerFactory())

    response = admin_site.get(f"{CHANGELIST}{job.pk}/change/")

    field = re.search(
        r'field-stored_output.*?<div class="readonly">(.*?)</div>', response.content.decode(), re.S
    )
    assert field.group(1) == "—"
