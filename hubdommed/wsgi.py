"""WSGI entry point, served by gunicorn (`gunicorn hubdommed.wsgi`)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")

application = get_wsgi_application()
