"""A stream whose database stops answering mid-stream (a hung server, a network that drops
every packet): its reads wait on a socket that tells nothing, yet the stream keeps its own
bounds (its keep-alive comments, its end at JOB_OUTPUT_FOLLOW_MAX_SECONDS) and gives its
slot back.

The stream process (uvicorn, ``hubdommed.asgi``) runs as a real process, its database
behind a proxy the test freezes: connections stay open and nothing flows.
"""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import connection

from tests.job import test_output_follow
from tests.job.test_follow_limits import Stream, status_of_one_more
from tests.job.test_output_follow import append, headers_of, running_job
from tests.polling import wait_until
from tests.processes import database_sessions
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.django_db(transaction=True)

streams = test_output_follow.streams

# Long enough for the stream to open and show its first piece on a loaded machine.
MAX_SECONDS = 20


def test_a_stream_whose_database_hangs_keeps_talking_ends_on_time_and_gives_its_slot_back(
    streams, user
):
    db = connection.settings_dict
    # The stream process's sessions, told apart from any other test's on this database.
    name = f"stream-hang-{uuid.uuid4().hex[:8]}"
    proxy = TcpProxy(int(db["PORT"]), target_host=db["HOST"])
    server = None
    try:
        server = streams(
            PGAPPNAME=name,
            DATABASE_URL=f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}",
            JOB_OUTPUT_FOLLOW_POLL_SECONDS="0.3",
            JOB_OUTPUT_FOLLOW_KEEPALIVE_SECONDS="1",
            JOB_OUTPUT_FOLLOW_MAX_SECONDS=str(MAX_SECONDS),
            JOB_OUTPUT_FOLLOW_MAX_PER_TENANT="1",
        )
        job = running_job(user.tenant)
        append(job, 0, "before\n")

        with Stream(server, job, headers_of(user)) as stream:
            assert stream.status_code == 200, server.log_text()
            while b"before" not in stream.body:
                stream.body += next(stream.chunks)
            proxy.freeze()
            frozen_at = time.monotonic()
            # Stored while the stream's database hangs: its next read waits on it.
            append(job, 1, "during\n")
            seen = len(stream.body)
            body = stream.read_to_the_end(within=MAX_SECONDS + 40)
            ended_after = time.monotonic() - frozen_at

        during = body[seen:]
        assert b": still running" in during, server.log_text()
        assert b"event: end" not in during
        assert ended_after < MAX_SECONDS + 30, ended_after
        assert "could not be read" in server.log_text()

        # The database answers again: the tenant's one slot was given back.
        proxy.thaw()
        wait_until(
            lambda: status_of_one_more(server, job, headers_of(user)) == 200,
            timeout=60,
            message=server.log_text,
        )
    finally:
        proxy.thaw()
        if server is not None:
            server.stop()
        proxy.close()
        # The stream process's sessions end as the proxy's sockets close: gone before the
        # test database is dropped.
        wait_until(lambda: database_sessions(name) == 0, timeout=60, message="sessions still open")
