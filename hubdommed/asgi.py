"""ASGI entry point for the streams that outlive a request (uvicorn hubdommed.asgi).

Following a job's output live (``GET /api/v1/jobs/{id}/output/stream``) holds a
connection open for as long as the job runs. Under gunicorn's sync workers that would be a
worker per follower, so the API process answers it with what is there now (``job.live``),
and this process holds the streams: each follower a coroutine, every follower of every
job one Redis subscription, the log's reads on a few threads of their own.

It serves the whole API (the same URLs, middleware and settings) so that a proxy may send
it only the streams' path, or anything while the API process is away; the API itself is
served faster by gunicorn. Django's persistent connections are made for threads that
live long: here each request has a thread of its own, so they are off (``DB_CONN_MAX_AGE``
0 unless set).
"""

import asyncio
import logging
import os

from django.core.asgi import get_asgi_application

from common.charsets import ApiASGIRequest
from common.env import settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
os.environ.setdefault("DB_CONN_MAX_AGE", "0")
# A bad variable: one line naming it, before uvicorn serves anything.
settings_or_exit()

logger = logging.getLogger("hubdommed.http")

_django = get_asgi_application()
# A charset that is no text encoding (``charset=zlib``) is not the request's encoding.
_django.request_class = ApiASGIRequest


async def application(scope, receive, send):
    """Django's application, with a bound on how long a client may read nothing.

    uvicorn waits, without a limit, for a client's socket to take more before a write
    returns: a client that stops reading a stream would hold it (its coroutine, its
    socket, what waits in its buffers) for ever, past the stream's own time limits,
    which are only looked at between writes.
    """
    if scope["type"] != "http":
        return await _django(scope, receive, send)
    from django.conf import settings

    stall = settings.JOB_OUTPUT_FOLLOW_STALL_SECONDS

    async def send_or_let_go(message):
        try:
            async with asyncio.timeout(stall):
                await send(message)
        except TimeoutError:
            logger.warning(
                "a client read nothing for %g s: its response to %s is closed",
                stall,
                scope.get("path"),
            )
            # How Django takes a client that has gone: it ends the response (a stream's
            # generator is closed, its resources given back) and returns.
            raise asyncio.CancelledError from None

    await _django(scope, receive, send_or_let_go)
