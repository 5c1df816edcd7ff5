"""What Django's error reports (the DEBUG page, the error e-mails) may show.

``make run`` serves with DEBUG on, and its page lists every setting, the request's
environment (which a WSGI server fills from the process's own: ``DATABASE_URL``,
``RABBITMQ_URL``...) and each frame's local variables. Django hides names that look like
keys and passwords; the URLs of this project carry credentials too.
"""

from __future__ import annotations

import re

from django.views.debug import SafeExceptionReporterFilter

# The user information of a URL: "amqp://guest:secret@host" -> "amqp://********@host".
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.I)


def without_url_credentials(text: str) -> str:
    return _URL_CREDENTIALS.sub(r"\g<scheme>********@", text)


class ExceptionReporterFilter(SafeExceptionReporterFilter):
    # Django's own list, and whatever holds a URL, a host or a credential: the broker's,
    # Redis's and the database's addresses say where to knock, and often with what.
    hidden_settings = re.compile(
        "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|CREDENTIAL|URL|DSN|LOCATION|HOST",
        flags=re.I,
    )

    def cleanse_setting(self, key, value):
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str):
            # A credential in a value under an innocent name (a list of URLs, a variable).
            cleansed = without_url_credentials(cleansed)
        return cleansed

    def get_traceback_frame_variables(self, request, tb_frame):
        # Local variables go through the same filter as settings: by name, then by value.
        return [
            (name, self._cleanse_variable(name, value))
            for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]

    def _cleanse_variable(self, name, value):
        try:
            return self.cleanse_setting(name, value)
        except RecursionError:
            # A structure that contains itself: the page does without it.
            return self.cleansed_substitute
