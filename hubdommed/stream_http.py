"""The stream process's HTTP protocol: uvicorn's own (h11), with the requests it refuses
before the application sees them (a request line or header it cannot parse) answered in
the API's one error format, as gunicorn's are (``gunicorn.conf.py``), not in plain text.

uvicorn takes it by name: ``uvicorn --http hubdommed.stream_http:JsonRefusals``.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# Without uvicorn's message: it may quote what the client sent.
_BODY = json.dumps(
    {
        "error": {
            "code": "malformed_request",
            "message": "The request cannot be parsed.",
            "details": {},
        }
    }
).encode()


class JsonRefusals(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(_BODY)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=_BODY),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()
