import re
import uuid

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import JsonResponse
from django.http.multipartparser import MultiPartParserError

from common.api import error_body
from common.context import reset_correlation_id, set_correlation_id
from common.jsondata import PROBLEM, describe_path, unstorable_path

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


class UnstorableTextMiddleware:
    """A 400 in the error format for a query string, form body or header holding U+0000.

    JSON bodies are checked by the API's parser (``common.parsers``); what Django decodes
    itself is checked here, for every view (the admin's forms and searches included).
    Lone surrogates cannot come out of these: Django decodes them from UTF-8 (replacing
    what does not decode) or, for headers, from Latin-1.
    """

    FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            problem = self._problem(request)
        except RequestDataTooBig:
            return JsonResponse(
                error_body("too_large", "The request body is too large."), status=413
            )
        except (MultiPartParserError, SuspiciousOperation):
            # Too many fields or files, a broken multipart body: reading the form is this
            # middleware's doing, so its refusals keep the error format.
            return JsonResponse(
                error_body("malformed_request", "The form body cannot be read."), status=400
            )
        if problem is not None:
            return JsonResponse(error_body("invalid", "The input is invalid.", problem), status=400)
        return self.get_response(request)

    def _problem(self, request) -> dict | None:
        for name, value in request.META.items():
            # Credentials are checked, never stored: a bad one is the authenticator's 401.
            if name == "HTTP_AUTHORIZATION":
                continue
            if (
                name.startswith("HTTP_")
                and isinstance(value, str)
                and unstorable_path(value) is not None
            ):
                return {name[5:].replace("_", "-").title(): [PROBLEM]}
        sources = [request.GET]
        if request.method == "POST" and request.content_type in self.FORM_TYPES:
            sources.append(request.POST)  # parsed once; Django keeps it for the view
        for source in sources:
            for key, values in source.lists():
                path = unstorable_path({key: values})
                if path is not None:
                    return {describe_path(path[:1]): [PROBLEM]}
        return None
