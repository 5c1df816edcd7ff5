"""WSGI entry point, served by gunicorn (`gunicorn hubdommed.wsgi`)."""

import os

from django.core.wsgi import get_wsgi_application

from common.charsets import ApiWSGIRequest
from common.env import settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
# A bad variable: one line naming it (under a server that reads no gunicorn.conf.py too).
settings_or_exit()

application = get_wsgi_application()
# A charset that is no text encoding (``charset=zlib``) is not the request's encoding.
application.request_class = ApiWSGIRequest
