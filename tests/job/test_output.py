"""A running job's output: its worker sends it in chunks, people read it by offset."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from job.models import JobOutputChunk
from tests.clients import client_of
from tests.factories import JobFactory, RunningJobFactory, UserFactory
from tests.job.support import events_of, worker_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(worker, worker_api, user):
    """A job of the person's tenant that this worker claimed through the API."""
    job = JobFactory(automation=worker.automation, tenant=user.tenant)
    assert worker_api.post(f"/api/v1/jobs/{job.id}/start").status_code == 200
    job.refresh_from_db()
    return job


def send(client, job, seq, text, *, claim_token=None):
    body = {"claim_token": str(claim_token or job.claim_token), "seq": seq, "text": text}
    return client.post(f"/api/v1/jobs/{job.id}/output", body, format="json")


def read(client, job, **params):
    return client.get(f"/api/v1/jobs/{job.id}/output", params)


def stored(job) -> list[tuple[int, int, str]]:
    return list(
        JobOutputChunk.objects.filter(job=job)
        .order_by("offset")
        .values_list("seq", "offset", "text")
    )


# --- the worker's side ---------------------------------------------------------------------


def test_chunks_are_stored_one_after_the_other(worker_api, running):
    assert send(worker_api, running, 0, "one\n").json()["offset"] == 0
    response = send(worker_api, running, 1, "two\n")

    assert response.status_code == 200
    assert response.json() == {
        "job": running.id,
        "attempt": 1,
        "seq": 1,
        "offset": 4,
        "stored": True,
    }
    assert stored(running) == [(0, 0, "one\n"), (1, 4, "two\n")]
    assert events_of(running.id) == ["JobStarted"]


def test_a_retried_chunk_is_stored_once(worker_api, running):
    send(worker_api, running, 0, "one\n")
    send(worker_api, running, 1, "two\n")

    again = send(worker_api, running, 0, "one\n")

    assert again.status_code == 200
    assert again.json()["stored"] is False and again.json()["offset"] == 0
    assert stored(running) == [(0, 0, "one\n"), (1, 4, "two\n")]


def test_a_chunk_sent_again_with_other_text_is_refused_and_the_first_kept(worker_api, running):
    send(worker_api, running, 0, "one\n")
    send(worker_api, running, 1, "two\n")

    # Not a retry: a retry sends the same text. Its text would be lost without a word.
    again = send(worker_api, running, 0, "uno\n")

    assert again.status_code == 409
    error = again.json()["error"]
    assert error["code"] == "output_seq_taken"
    assert error["details"] == {"seq": 0, "expected_seq": 2}
    assert stored(running) == [(0, 0, "one\n"), (1, 4, "two\n")]


def test_a_chunk_out_of_order_is_refused_with_the_one_expected(worker_api, running):
    send(worker_api, running, 0, "one\n")

    response = send(worker_api, running, 2, "three\n")

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "output_out_of_order"
    assert error["details"] == {"expected_seq": 1}
    assert stored(running) == [(0, 0, "one\n")]


def test_the_first_chunk_of_an_attempt_is_its_seq_0(worker_api, running):
    response = send(worker_api, running, 1, "x")

    assert response.status_code == 409
    assert response.json()["error"]["details"] == {"expected_seq": 0}


def test_a_chunk_under_a_stale_claim_is_refused(worker_api, running):
    response = send(worker_api, running, 0, "x", claim_token=uuid.uuid4())

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "stale_claim"
    assert stored(running) == []


def test_a_chunk_for_a_finished_job_is_refused(worker_api, running):
    token = str(running.claim_token)
    worker_api.post(f"/api/v1/jobs/{running.id}/complete", {"claim_token": token}, format="json")

    response = send(worker_api, running, 0, "late")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_finished"
    assert stored(running) == []


def test_a_worker_cannot_send_output_for_another_automations_job(worker_api):
    foreign = RunningJobFactory()

    response = send(worker_api, foreign, 0, "x")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "job_not_found"


def test_a_person_cannot_send_output(user, person_client, running):
    # A person's token is no worker credential; a person let in all the same is refused.
    assert send(client_of(user, token=True), running, 0, "x").status_code == 401
    response = send(person_client, running, 0, "x")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"
    assert stored(running) == []


@pytest.mark.parametrize(
    "body",
    [
        {"seq": -1, "text": "x"},
        {"seq": "first", "text": "x"},
        {"seq": 0},
        {"seq": 0, "text": "x" * (64 * 1024 + 1)},
    ],
)
def test_a_bad_chunk_is_a_400(worker_api, running, body):
    response = worker_api.post(
        f"/api/v1/jobs/{running.id}/output",
        {"claim_token": str(running.claim_token), **body},
        format="json",
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert stored(running) == []


def test_text_that_cannot_be_stored_is_replaced(worker_api, running):
    assert send(worker_api, running, 0, "a\u0000b").status_code == 200

    assert stored(running) == [(0, 0, "a\ufffdb")]


def test_a_new_attempt_numbers_its_chunks_from_0_and_continues_the_log(worker, running):
    JobOutputChunk.objects.create(job=running, attempt=1, seq=0, offset=0, text="first try\n")
    # The first attempt's worker was lost; the job was claimed again.
    type(running).objects.filter(pk=running.pk).update(attempt=2)
    running.refresh_from_db()

    response = send(worker_client(worker), running, 0, "second try\n")

    assert response.status_code == 200
    assert stored(running) == [(0, 0, "first try\n"), (0, 10, "second try\n")]


def test_past_its_limit_the_log_loses_its_oldest_chunks(worker_api, running, settings):
    settings.JOB_OUTPUT_MAX_CHARS = 10
    for seq, text in enumerate(["aaaa", "bbbb", "cccc", "dddd"]):
        assert send(worker_api, running, seq, text).status_code == 200

    # 16 characters sent, at most 10 kept: the chunks starting before offset 6 are gone.
    assert stored(running) == [(2, 8, "cccc"), (3, 12, "dddd")]


# --- people's side -------------------------------------------------------------------------


def test_people_read_the_log_page_by_page(worker_api, person_client, running):
    for seq, text in enumerate(["one\n", "two\n", "three\n"]):
        send(worker_api, running, seq, text)

    first = read(person_client, running, limit=6)
    assert first.status_code == 200
    assert first.json() == {
        "job": running.id,
        "status": "running",
        "offset": 0,
        "next_offset": 6,
        "dropped_before": 0,
        "text": "one\ntw",
        "finished": False,
    }
    rest = read(person_client, running, offset=6).json()
    assert (rest["text"], rest["next_offset"], rest["finished"]) == ("o\nthree\n", 14, False)
    assert read(person_client, running, offset=14).json()["text"] == ""


def test_the_reader_learns_the_log_ended_with_the_job(worker_api, person_client, running):
    send(worker_api, running, 0, "done\n")
    token = str(running.claim_token)
    worker_api.post(f"/api/v1/jobs/{running.id}/complete", {"claim_token": token}, format="json")

    page = read(person_client, running, limit=2).json()
    assert page["status"] == "succeeded" and page["finished"] is False
    last = read(person_client, running, offset=page["next_offset"]).json()
    assert last["text"] == "ne\n" and last["finished"] is True


def test_a_job_without_output_reads_empty(person_client, user):
    job = JobFactory(tenant=user.tenant)

    page = read(person_client, job).json()

    assert (page["text"], page["next_offset"], page["dropped_before"]) == ("", 0, 0)


def test_offsets_stay_valid_when_the_oldest_chunks_are_dropped(
    worker_api, person_client, running, settings
):
    settings.JOB_OUTPUT_MAX_CHARS = 10
    send(worker_api, running, 0, "aaaa")
    send(worker_api, running, 1, "bbbb")
    before = read(person_client, running).json()
    assert before["next_offset"] == 8
    send(worker_api, running, 2, "cccc")
    send(worker_api, running, 3, "dddd")

    after = read(person_client, running, offset=before["next_offset"]).json()
    assert (after["text"], after["dropped_before"]) == ("ccccdddd", 8)
    late = read(person_client, running, offset=2).json()
    assert (late["offset"], late["dropped_before"], late["text"]) == (2, 8, "ccccdddd")


def test_the_plain_text_page_says_how_much_was_dropped(
    worker_api, person_client, running, settings
):
    settings.JOB_OUTPUT_MAX_CHARS = 10
    for seq, text in enumerate(["aaaa", "bbbb", "cccc", "dddd"]):
        send(worker_api, running, seq, text)

    by_accept = person_client.get(f"/api/v1/jobs/{running.id}/output", HTTP_ACCEPT="text/plain")
    by_format = read(person_client, running, format="text")

    for response in (by_accept, by_format):
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/plain")
        assert response.content.decode() == "[... 8 characters dropped ...]\nccccdddd"


def test_a_text_page_without_drops_is_the_text_alone(worker_api, person_client, running):
    send(worker_api, running, 0, "one\n")

    response = read(person_client, running, format="text", offset=1)

    assert response.content.decode() == "ne\n"


def test_another_tenants_job_output_is_a_404(worker_api, running, other_tenant):
    send(worker_api, running, 0, "secret\n")
    stranger = client_of(UserFactory(tenant=other_tenant))

    response = read(stranger, running)

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "job_not_found"


def test_reading_output_needs_a_person(running, worker_api):
    assert read(APIClient(), running).status_code == 401
    # A worker's credential is not a person's.
    assert read(worker_api, running).status_code == 401


@pytest.mark.parametrize("params", [{"offset": -1}, {"limit": 0}, {"limit": 1024 * 1024 + 1}])
def test_a_bad_page_is_a_400(person_client, running, params):
    response = read(person_client, running, **params)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"


def test_an_empty_text_page_is_still_text(person_client, running):
    response = read(person_client, running, format="text")

    assert response.status_code == 200 and response.content == b""
    assert response["Content-Type"] == "text/plain; charset=utf-8"
