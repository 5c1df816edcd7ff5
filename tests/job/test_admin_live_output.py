"""A running job's page in the admin shows its output as it comes: the page's script reads
the job's output view, a page of its log from an offset, as JSON, with the staff's session."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission

from job.models import JobOutputChunk
from job.services import job_claim, job_complete, job_create, job_output_append
from tests.factories import AutomationWithWorkerFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_site(client, platform_admin):
    client.force_login(platform_admin)
    return client


class Running:
    """A claimed job of a fresh automation, and the way its worker sends output."""

    def __init__(self, tenant):
        self.automation = AutomationWithWorkerFactory()
        self.job, _ = job_create(
            tenant=tenant,
            automation_id=self.automation.pk,
            params={},
            requested_by=UserFactory(tenant=tenant),
        )
        self.claim_token = job_claim(worker=self.automation.worker, job_id=self.job.pk).claim_token
        self.seq = 0

    def send(self, text: str) -> None:
        job_output_append(
            worker=self.automation.worker,
            job_id=self.job.pk,
            claim_token=self.claim_token,
            seq=self.seq,
            text=text,
        )
        self.seq += 1

    def complete(self) -> None:
        job_complete(
            worker=self.automation.worker,
            job_id=self.job.pk,
            claim_token=self.claim_token,
            result={},
        )

    @property
    def output_url(self) -> str:
        return f"/admin/job/job/{self.job.pk}/output/"

    @property
    def page_url(self) -> str:
        return f"/admin/job/job/{self.job.pk}/change/"


@pytest.fixture
def running(tenant):
    return Running(tenant)


def read(client, url: str, offset) -> dict:
    response = client.get(url, {"offset": offset})
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"] == "application/json"
    return response.json()


def test_the_output_view_answers_from_the_start_then_from_where_the_last_read_ended(
    admin_site, running
):
    running.send("tick 0\n")

    assert read(admin_site, running.output_url, 0) == {
        "job": running.job.pk,
        "status": "running",
        "offset": 0,
        "next_offset": 7,
        "dropped_before": 0,
        "text": "tick 0\n",
        "finished": False,
    }

    running.send("tick 1 <b>&\n")
    JobOutputChunk.objects.create(
        job=running.job, attempt=running.job.attempt, seq=running.seq, offset=19, text="tick 2\n"
    )

    page = read(admin_site, running.output_url, 7)
    assert (page["offset"], page["next_offset"]) == (7, 26)
    assert page["text"] == "tick 1 <b>&\ntick 2\n"  # as sent: escaping is the page's
    assert page["finished"] is False
    # Nothing new yet: the same end, no text.
    page = read(admin_site, running.output_url, 26)
    assert (page["next_offset"], page["text"], page["finished"]) == (26, "", False)


def test_the_output_view_says_finished_once_the_job_ended_and_its_log_is_read_to_its_end(
    admin_site, running, monkeypatch
):
    monkeypatch.setattr("job.admin.ADMIN_OUTPUT_CHARS", 5)
    running.send("0123456789")
    running.complete()

    # A read answers at most ADMIN_OUTPUT_CHARS characters: there is more after this one.
    first = read(admin_site, running.output_url, 0)
    assert (first["text"], first["next_offset"], first["finished"]) == ("01234", 5, False)
    last = read(admin_site, running.output_url, first["next_offset"])
    assert last == {
        "job": running.job.pk,
        "status": "succeeded",
        "offset": 5,
        "next_offset": 10,
        "dropped_before": 0,
        "text": "56789",
        "finished": True,
    }


def test_the_output_view_says_where_the_log_starts_once_its_oldest_chunks_are_gone(
    admin_site, running, settings
):
    settings.JOB_OUTPUT_MAX_CHARS = 12
    for text in ("aaaaaa", "bbbbbb", "cccccc"):
        running.send(text)
    assert JobOutputChunk.objects.filter(job=running.job).count() == 2  # "aaaaaa" is gone

    page = read(admin_site, running.output_url, 2)

    assert page["offset"] == 2
    assert page["dropped_before"] == 6
    assert (page["text"], page["next_offset"]) == ("bbbbbbcccccc", 18)


@pytest.mark.parametrize("offset", ["-1", "x", "1.5", "²", "", "9" * 19])
def test_a_bad_offset_is_refused_in_the_errors_format(admin_site, running, offset):
    response = admin_site.get(running.output_url, {"offset": offset})

    assert response.status_code == 400
    body = response.json()
    assert body["error"]["code"] == "invalid"
    assert body["error"]["message"]
    assert list(body["error"]["details"]) == ["offset"]


def test_without_an_offset_the_output_view_reads_from_the_start(admin_site, running):
    running.send("tick 0\n")

    response = admin_site.get(running.output_url)

    assert response.status_code == 200
    assert response.json()["text"] == "tick 0\n"


def test_an_unknown_job_is_a_404_in_the_errors_format(admin_site, running):
    for url in (f"/admin/job/job/{running.job.pk + 1000}/output/", "/admin/job/job/abc/output/"):
        response = admin_site.get(url)

        assert response.status_code == 404
        assert response.json()["error"]["code"] == "job_not_found"


def test_the_output_view_only_reads(admin_site, running):
    response = admin_site.post(running.output_url, {"offset": 0})

    assert response.status_code == 405
    assert response["Allow"] == "GET"
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_who_is_not_staff_is_sent_to_the_login_page(client, running, user, platform_admin):
    running.send("tick 0\n")
    assert client.get(running.output_url).status_code == 302
    client.force_login(user)  # a tenant's person: the API's reader, not the admin's

    response = client.get(running.output_url, {"offset": 0})

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    # Where the staff read it.
    client.force_login(platform_admin)
    assert read(client, running.output_url, 0)["text"] == "tick 0\n"


def test_staff_read_the_output_with_the_jobs_view_permission_only(client, running):
    running.send("tick 0\n")
    staff = UserFactory(tenant=None, is_staff=True)
    client.force_login(staff)

    response = client.get(running.output_url, {"offset": 0})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"

    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    staff = type(staff).objects.get(pk=staff.pk)  # permissions are cached on the user
    client.force_login(staff)
    assert read(client, running.output_url, 0)["text"] == "tick 0\n"


def hook(page: str) -> dict[str, str]:
    """The ``data-output-*`` attributes of the page's live output."""
    pre = re.search(r'<pre class="output-text output-live" id="job-output"([^>]*)>', page)
    assert pre, "no live output on the page"
    return dict(re.findall(r'data-output-([a-z]+)="([^"]*)"', pre.group(1)))


def test_a_running_jobs_page_says_where_its_script_reads_on_from(admin_site, running, monkeypatch):
    monkeypatch.setattr("job.admin.ADMIN_OUTPUT_CHARS", 12)
    running.send("early line\n")
    running.send("late line\n")

    page = admin_site.get(running.page_url).content.decode()

    # The end of the log is shown (from offset 9 to 21), and read on from its end.
    assert hook(page) == {
        "url": running.output_url,
        "from": "9",
        "offset": "21",
        "chars": "12",
    }
    assert "[... 9 characters before ...]\n</span>e\nlate line\n</pre>" in page
    assert 'id="job-output-status">Job running:' in page
    script = re.search(r'<script src="([^"]*/job/live_output\.js)" defer>', page).group(1)
    served = admin_site.get(script)
    assert served.status_code == 200
    assert b'getElementById("job-output")' in b"".join(served.streaming_content)


def test_a_pending_jobs_page_reads_its_output_from_the_start(admin_site, tenant):
    automation = AutomationWithWorkerFactory()
    job, _ = job_create(
        tenant=tenant,
        automation_id=automation.pk,
        params={},
        requested_by=UserFactory(tenant=tenant),
    )

    page = admin_site.get(f"/admin/job/job/{job.pk}/change/").content.decode()

    assert hook(page) == {
        "url": f"/admin/job/job/{job.pk}/output/",
        "from": "0",
        "offset": "0",
        "chars": "20000",
    }


def test_a_finished_jobs_page_shows_its_output_with_nothing_more_to_read(admin_site, running):
    running.send("the last line\n")
    running.complete()

    page = admin_site.get(running.page_url).content.decode()

    assert '<pre class="output-text">the last line\n</pre>' in page
    assert "data-output-url" not in page
    assert 'id="job-output-status"' not in page
