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

import os

from django.core.asgi import get_asgi_application

from common.charsets import ApiASGIRequest
from common.env import settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
os.environ.setdefault("DB_CONN_MAX_AGE", "0")
# A bad variable: one line naming it, before uvicorn serves anything.
settings_or_exit()

application = get_asgi_application()
# A charset that is no text encoding (``charset=zlib``) is not the request's encoding.
application.request_class = ApiASGIRequest
