import re
import uuid

from common.context import reset_correlation_id, set_correlation_id

# Accept a caller's id only when it is short and plain: it ends up in logs and envelopes.
_ACCEPTABLE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class CorrelationIdMiddleware:
    """Takes ``X-Request-ID`` (or makes one), exposes it to the outbox, echoes it back."""

    header = "HTTP_X_REQUEST_ID"

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        incoming = request.META.get(self.header, "")
        correlation_id = incoming if _ACCEPTABLE_ID.match(incoming) else str(uuid.uuid4())
        token = set_correlation_id(correlation_id)
        try:
            response = self.get_response(request)
        finally:
            reset_correlation_id(token)
        response["X-Request-ID"] = correlation_id
        return response
