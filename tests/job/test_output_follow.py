"""Following a job's output live (``GET /jobs/{id}/output/stream``, Server-Sent Events).

The API process answers a follower with the log as it is now and when to ask again; the
stream process (uvicorn, ``hubdommed.asgi``, a real process here) holds the stream open
and sends each piece as it is stored, woken by Redis or, without it, by its own reads.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import pytest
from django.db import connection, connections
from rest_framework.test import APIClient

from identity.tokens import issue_access_token
from job import live
from job.models import JobOutputChunk
from job.services import job_complete, job_output_append
from tests.clients import client_of
from tests.factories import RunningJobFactory, UserFactory, WorkerFactory
from tests.forwarding import Forwarder
from tests.polling import wait_until
from tests.servers import stream_server
from tests.sse import Follower

STREAM = "/api/v1/jobs/{id}/output/stream"


def running_job(tenant):
    job = RunningJobFactory(tenant=tenant)
    job.worker = WorkerFactory(automation=job.automation)
    return job


@pytest.fixture
def running(user):
    return running_job(user.tenant)


def append(job, seq: int, text: str):
    return job_output_append(
        worker=job.worker, job_id=job.pk, claim_token=job.claim_token, seq=seq, text=text
    )


def complete(job):
    job_complete(worker=job.worker, job_id=job.pk, claim_token=job.claim_token, result=None)


def parse(body: bytes) -> list[tuple[str | None, str, object]]:
    """The events of a whole answer: (id, name, data)."""
    events = []
    for block in body.decode().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and ":" in line[1:]
        )
        if "event" in fields:
            events.append((fields.get("id"), fields["event"], json.loads(fields["data"])))
    return events


def get(client, job, **headers):
    response = client.get(STREAM.format(id=job.pk), **headers)
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return response, body


# --- the API process: the log as it is now ----------------------------------------------------


@pytest.mark.django_db
def test_the_api_process_answers_with_the_log_so_far_and_when_to_ask_again(user, running):
    append(running, 0, "one\n")
    append(running, 1, "two\r\nthree\n")

    response, body = get(client_of(user), running)

    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    assert body.startswith(b"retry: 1000\n\n")
    # One event for what is there; the text's own line breaks inside its JSON.
    assert parse(body) == [
        ("15", "output", {"offset": 0, "next_offset": 15, "text": "one\ntwo\r\nthree\n"})
    ]


@pytest.mark.django_db
def test_a_reconnection_resumes_after_its_last_event_id_and_it_wins_over_the_offset(user, running):
    append(running, 0, "one\n")
    append(running, 1, "two\n")

    _, body = get(client_of(user), running, QUERY_STRING="offset=0", HTTP_LAST_EVENT_ID="4")

    assert parse(body) == [("8", "output", {"offset": 4, "next_offset": 8, "text": "two\n"})]


@pytest.mark.django_db
def test_nothing_new_while_running_is_no_event_at_all(user, running):
    append(running, 0, "one\n")

    response, body = get(client_of(user), running, HTTP_LAST_EVENT_ID="4")

    assert response.status_code == 200
    assert body == b"retry: 1000\n\n"


@pytest.mark.django_db
def test_a_finished_jobs_log_ends_with_its_status_then_answers_204_from_its_end(user, running):
    append(running, 0, "done\n")
    complete(running)

    _, body = get(client_of(user), running)
    again, rest = get(client_of(user), running, HTTP_LAST_EVENT_ID="5")

    assert parse(body) == [
        ("5", "output", {"offset": 0, "next_offset": 5, "text": "done\n"}),
        ("5", "end", {"status": "succeeded", "next_offset": 5}),
    ]
    # 204 is how a server tells an EventSource to stop reconnecting.
    assert again.status_code == 204 and rest == b""


@pytest.mark.django_db
def test_a_follower_far_behind_is_told_how_much_was_dropped(user, running, settings):
    append(running, 0, "a" * 10)
    append(running, 1, "b" * 10)
    JobOutputChunk.objects.filter(job=running, seq=0).delete()

    _, body = get(client_of(user), running)

    assert parse(body) == [
        ("20", "output", {"offset": 10, "next_offset": 20, "text": "b" * 10, "dropped": 10})
    ]


@pytest.mark.django_db
def test_a_long_log_comes_in_events_of_bounded_size(user, running):
    for seq in range(3):
        append(running, seq, "x" * 50_000)

    _, body = get(client_of(user), running)

    events = parse(body)
    assert [len(data["text"]) for _, _, data in events] == [65536, 65536, 18928]
    assert "".join(data["text"] for _, _, data in events) == "x" * 150_000


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["-1", "abc", "1.5", str(2**63)])
def test_a_bad_last_event_id_or_offset_is_a_400_in_the_one_format(user, running, value):
    by_header, _ = get(client_of(user), running, HTTP_LAST_EVENT_ID=value)
    by_query, _ = get(client_of(user), running, QUERY_STRING=f"offset={value}")

    for response in (by_header, by_query):
        assert response.status_code == 400
        assert response["Content-Type"] == "application/json"
        assert response.json()["error"]["code"] == "invalid"


@pytest.mark.django_db
def test_errors_are_json_even_to_a_client_that_accepts_only_events(user, running):
    other = UserFactory()

    response, _ = get(client_of(other), running, HTTP_ACCEPT="text/event-stream")
    anonymous, _ = get(APIClient(), running, HTTP_ACCEPT="text/event-stream")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "job_not_found"
    assert anonymous.status_code == 401
    assert anonymous["Content-Type"] == "application/json"


# --- the stream process: held open, each piece as it is stored --------------------------------


@pytest.fixture
def streams(settings, tmp_path, request):
    servers = []

    def start(**env):
        server = stream_server(settings, tmp_path, **env).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def headers_of(person) -> dict[str, str]:
    return {"Authorization": f"Bearer {issue_access_token(person).token}"}


def texts(follower: Follower) -> list[str]:
    return [event.json["text"] for event in follower.events if event.name == "output"]


@pytest.mark.django_db(transaction=True)
def test_the_stream_sends_each_piece_as_it_is_stored_and_ends_with_the_job(streams, user, running):
    server = streams()
    append(running, 0, "first\n")
    follower = Follower(f"{server.url}{STREAM.format(id=running.pk)}", headers_of(user)).start()
    try:
        wait_until(lambda: texts(follower) == ["first\n"], timeout=20, message=server.log_text)

        stored_at = time.time()
        append(running, 1, "second\n")
        wait_until(lambda: len(texts(follower)) == 2, timeout=20, message=server.log_text)
        complete(running)
        assert follower.ended.wait(20), server.log_text()
    finally:
        follower.stop()

    assert texts(follower) == ["first\n", "second\n"]
    assert [event.id for event in follower.events] == ["6", "13", "13"]
    assert follower.events[-1].json == {"status": "succeeded", "next_offset": 13}
    # One connection: the stream stayed open from the first piece to the end.
    assert follower.connections == 1
    print(f"second piece followed {follower.events[1].received_at - stored_at:.3f} s after")


@pytest.mark.django_db(transaction=True)
def test_without_redis_the_stream_still_follows_by_reading_on_its_own(streams, user, running):
    # A port nothing listens on: every wake is lost, the reads are not.
    server = streams(REDIS_URL="redis://127.0.0.1:9/0", JOB_OUTPUT_FOLLOW_POLL_SECONDS="0.3")
    follower = Follower(f"{server.url}{STREAM.format(id=running.pk)}", headers_of(user)).start()
    try:
        wait_until(lambda: follower.connections == 1, timeout=20, message=server.log_text)
        append(running, 0, "quiet\n")
        wait_until(lambda: texts(follower) == ["quiet\n"], timeout=20, message=server.log_text)
        complete(running)
        assert follower.ended.wait(20), server.log_text()
    finally:
        follower.stop()
    assert "Redis not answering" in server.log_text()


@pytest.mark.django_db(transaction=True)
def test_followers_hold_no_database_connection_each(streams, user, settings):
    name = f"stream-{uuid.uuid4().hex[:8]}"
    server = streams(PGAPPNAME=name)
    jobs = [running_job(user.tenant) for _ in range(3)]
    followers = [
        Follower(f"{server.url}{STREAM.format(id=job.pk)}", headers_of(user)).start()
        for job in jobs
        for _ in range(10)
    ]
    try:
        wait_until(
            lambda: sum(f.connections for f in followers) == 30,
            timeout=30,
            message=server.log_text,
        )
        # Each follower has read at least once (its retry field came) and now waits.
        time.sleep(1.5)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name]
            )
            held = cursor.fetchone()[0]
        for job in jobs:
            append(job, 0, f"job {job.pk}\n")
        wait_until(
            lambda: all(texts(f) == [f"job {f.url.split('/')[-3]}\n"] for f in followers),
            timeout=30,
            message=server.log_text,
        )
    finally:
        for follower in followers:
            follower.stop()
    assert held <= live.READ_THREADS, held


@pytest.mark.django_db(transaction=True)
def test_a_stream_outlives_an_outage_of_the_database_and_of_redis(streams, user, running):
    db = connection.settings_dict
    database = Forwarder((db["HOST"], int(db["PORT"]))).open()
    redis_port = Forwarder(("127.0.0.1", 6379)).open()
    try:
        server = streams(
            DATABASE_URL=f"postgres://{db['USER']}@127.0.0.1:{database.port}/{db['NAME']}",
            REDIS_URL=f"redis://127.0.0.1:{redis_port.port}/0",
            JOB_OUTPUT_FOLLOW_POLL_SECONDS="0.3",
        )
        follower = Follower(f"{server.url}{STREAM.format(id=running.pk)}", headers_of(user))
        follower.start()
        append(running, 0, "before\n")
        wait_until(lambda: texts(follower) == ["before\n"], timeout=20, message=server.log_text)

        database.close()
        redis_port.close()
        append(running, 1, "during\n")
        wait_until(
            lambda: (
                "could not be read" in server.log_text()
                and "Redis not answering" in server.log_text()
            ),
            timeout=30,
            message=server.log_text,
        )
        database.open()
        redis_port.open()
        wait_until(lambda: len(texts(follower)) == 2, timeout=30, message=server.log_text)
        wait_until(lambda: "Redis answers again" in server.log_text(), timeout=30)
        complete(running)
        assert follower.ended.wait(30), server.log_text()
    finally:
        database.close()
        redis_port.close()
    follower.stop()

    assert texts(follower) == ["before\n", "during\n"]
    # The follower's own stream stayed open through it all.
    assert follower.connections == 1


def close_reader_connections() -> None:
    """Each of the log's reader threads closes its database connection (they keep one
    open, and this process's test database is dropped at its end)."""
    barrier = threading.Barrier(live.READ_THREADS)

    def close() -> None:
        barrier.wait(10)
        connections.close_all()

    for done in [live._reads.submit(close) for _ in range(live.READ_THREADS)]:
        done.result(20)


@pytest.mark.django_db(transaction=True)
def test_followers_of_one_job_at_one_offset_share_each_read(running, settings, monkeypatch):
    # No Redis: no wake comes between the reads (a wake makes the next read a new one).
    settings.REDIS_URL = "redis://127.0.0.1:9/0"
    append(running, 0, "one\n")
    reads = []
    read = live._read_async

    async def counted(job_id, offset):
        reads.append(offset)
        return await read(job_id, offset)

    monkeypatch.setattr(live, "_read_async", counted)

    async def first_events(count: int) -> list[str]:
        streams = [live.follow(running.pk, 0) for _ in range(count)]
        for stream in streams:
            assert await anext(stream) == "retry: 1000\n\n"
        events = await asyncio.gather(*(anext(stream) for stream in streams))
        for stream in streams:
            await stream.aclose()
        return events

    try:
        events = asyncio.run(first_events(50))
    finally:
        close_reader_connections()

    assert len(set(events)) == 1 and '"text": "one\\n"' in events[0]
    assert reads == [0]


@pytest.mark.django_db(transaction=True)
def test_a_head_request_for_a_running_jobs_stream_ends_at_once(streams, user, running):
    # A HEAD has no body: the stream is not followed for it, and the connection takes the
    # next request (before, the follow ran for its hour, holding the connection).
    import socket

    server = streams()
    token = headers_of(user)["Authorization"]
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as conn:
        conn.sendall(
            f"HEAD {STREAM.format(id=running.pk)} HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {token}\r\n\r\n"
            f"GET /api/v1/me HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk

    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert b"text/event-stream" in head
    assert rest.startswith(b"HTTP/1.1 200 "), answer[:600]
