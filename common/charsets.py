"""The charset a request's ``Content-Type`` names, and the request classes of the servers
(``hubdommed.wsgi``, ``hubdommed.asgi``) that take it only when it is a text encoding.

Django adopts any charset ``codecs.lookup`` knows as the request's encoding, and decodes
the query string and form bodies with it. Some of those are no text encoding at all
(``zlib``, ``base64``, ``rot13``): ``?x=1`` sent with ``Content-Type: text/plain;
charset=zlib`` made the request itself fail to build, a 500 before any middleware ran, on
every path. Such a charset is read as one Django does not know: the request's text is
UTF-8 (``DEFAULT_CHARSET``); the API's JSON parser refuses a body that names one
(``common.parsers``).
"""

from __future__ import annotations

from django.core.handlers.asgi import ASGIRequest
from django.core.handlers.wsgi import WSGIRequest
from django.utils.http import parse_header_parameters


def is_text_encoding(name: str) -> bool:
    """Whether ``name`` is a codec that turns bytes into text (``utf-8``, ``latin-1``)."""
    try:
        # Unlike ``codecs.lookup``, ``str.encode`` refuses the codecs of bytes to bytes.
        "".encode(name)
    except (LookupError, UnicodeError, ValueError):
        return False
    return True


class TextCharsetRequest:
    """A request whose encoding is the ``Content-Type``'s charset only when it is a text
    encoding (Django's own rule, with ``is_text_encoding`` for ``codecs.lookup``)."""

    def _set_content_type_params(self, meta):
        self.content_type, self.content_params = parse_header_parameters(
            meta.get("CONTENT_TYPE", "")
        )
        charset = self.content_params.get("charset")
        if charset is not None and is_text_encoding(charset):
            self.encoding = charset


class ApiWSGIRequest(TextCharsetRequest, WSGIRequest):
    pass


class ApiASGIRequest(TextCharsetRequest, ASGIRequest):
    pass
