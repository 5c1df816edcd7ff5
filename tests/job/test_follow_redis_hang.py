"""The stream process's Redis subscription (its followers' wakes) when Redis hangs: the
kernel still takes every byte sent to it and nothing answers, so no socket error ever
tells. The subscription must find out by itself (its ping goes unanswered), follow on by
reading meanwhile, and subscribe again once Redis answers.

The stream process (uvicorn, ``hubdommed.asgi``) runs as a real process over a private
redis-server that the test freezes (SIGSTOP) and thaws.
"""

from __future__ import annotations

import pytest

from tests.job import test_output_follow
from tests.job.test_output_follow import STREAM, append, headers_of, running_job, texts
from tests.polling import wait_until
from tests.private_services import private_redis  # noqa: F401 (a fixture)
from tests.sse import Follower

pytestmark = pytest.mark.django_db(transaction=True)

streams = test_output_follow.streams


def test_a_hung_redis_is_noticed_followed_through_and_subscribed_to_again(
    streams,
    user,
    private_redis,  # noqa: F811
):
    server = streams(REDIS_URL=private_redis.url, JOB_OUTPUT_FOLLOW_POLL_SECONDS="0.3")
    job = running_job(user.tenant)
    follower = Follower(f"{server.url}{STREAM.format(id=job.pk)}", headers_of(user)).start()
    try:
        append(job, 0, "before\n")
        wait_until(lambda: texts(follower) == ["before\n"], timeout=30, message=server.log_text)

        private_redis.freeze()
        wait_until(
            lambda: "Redis not answering" in server.log_text(),
            timeout=120,
            message=server.log_text,
        )
        append(job, 1, "during\n")
        wait_until(lambda: len(texts(follower)) == 2, timeout=30, message=server.log_text)

        private_redis.thaw()
        wait_until(
            lambda: "Redis answers again" in server.log_text(),
            timeout=120,
            message=server.log_text,
        )
        append(job, 2, "after\n")
        wait_until(lambda: len(texts(follower)) == 3, timeout=30, message=server.log_text)
    finally:
        private_redis.thaw()
        follower.stop()
        server.stop()

    assert texts(follower) == ["before\n", "during\n", "after\n"]
    # The follower's own stream stayed open through it all.
    assert follower.connections == 1
