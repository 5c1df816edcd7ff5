import logging
import re
import time
import uuid
from urllib.parse import unquote, unquote_to_bytes

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.utils.log import log_response

from common.api import error_body, not_found_view
from common.context import log_context
from common.jsondata import PROBLEM, describe_path, unstorable_path
from common.metrics import HTTP_REQUEST_DURATION, HTTP_REQUESTS

logger = logging.getLogger("django.request")
request_logger = logging.getLogger("hubdommed.http")

# Accept a caller's id only when it is short and plain: it ends up in logs and envelopes.
_ACCEPTABLE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class CorrelationIdMiddleware:
    """Takes ``X-Request-ID`` (or makes one), binds it to the request's work, echoes it back.

    Outermost, so that every line logged while the request is served (the other
    middleware's included) and every message it causes carries the id. An id that is not
    short and plain is not taken: the request gets a new one, which the response says.
    """

    header = "HTTP_X_REQUEST_ID"

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        incoming = request.META.get(self.header, "")
        correlation_id = incoming if _ACCEPTABLE_ID.match(incoming) else str(uuid.uuid4())
        # The tenant is bound too once the request's credential is checked (bind_log_ids).
        with log_context(correlation_id=correlation_id):
            response = self.get_response(request)
            if response.status_code >= 400:
                # Django's handler logs a 4xx/5xx after the last middleware has returned,
                # outside this context: logged here, the same line carries the ids (and
                # Django, seeing it logged, does not log it again).
                log_response(
                    "%s: %s",
                    response.reason_phrase,
                    request.path,
                    response=response,
                    request=request,
                )
        response["X-Request-ID"] = correlation_id
        return response


# Methods counted under their own name; anything else a client invents is "other".
_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Asked every few seconds by probes and Prometheus: logged at debug, counted all the same.
_QUIET_ROUTES = frozenset({"health/live", "health/ready", "metrics"})
UNMATCHED = "unmatched"
STATIC = "static"


def log_quietly(response):
    """Marks an answer that is routine traffic (an idle worker's poll, an expected refusal):
    its request line is logged at debug, not info. The answer itself is unchanged."""
    response.log_quietly = True
    return response


def route_of(request) -> str:
    """The URL pattern that matched (``api/v1/jobs/<int:pk>``), ``static`` for the static
    files, or ``unmatched``.

    Never the path itself: a label takes the pattern's few values, not one per id or per
    path a scanner tries. The catch-all views that answer 404 count as unmatched.
    """
    match = getattr(request, "resolver_match", None)
    if match is None:
        # Served before any URL pattern is tried: the static files (WhiteNoise).
        if request.path.startswith(f"/{settings.STATIC_URL.lstrip('/')}"):
            return STATIC
        return UNMATCHED
    if match.func is not_found_view:
        return UNMATCHED
    if getattr(match.func, "__name__", "") == "catch_all_view":  # the admin's 404s
        return UNMATCHED
    return match.route or UNMATCHED


class RequestMetricsMiddleware:
    """Counts and times each request by route template, method and status, and logs it.

    Just inside ``CorrelationIdMiddleware`` (its line carries the request's ids) and
    outside the others, so the status is the one the client gets.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.perf_counter()
        status = 500
        quiet = False
        try:
            response = self.get_response(request)
            status = response.status_code
            quiet = getattr(response, "log_quietly", False)
            return response
        finally:
            elapsed = time.perf_counter() - started
            route = route_of(request)
            method = request.method if request.method in _KNOWN_METHODS else "other"
            HTTP_REQUESTS.labels(route=route, method=method, status=str(status)).inc()
            HTTP_REQUEST_DURATION.labels(route=route, method=method).observe(elapsed)
            request_logger.log(
                logging.DEBUG if quiet or route in _QUIET_ROUTES else logging.INFO,
                "%s %s %d %.1f ms",
                method,
                request.path,
                status,
                elapsed * 1000,
                extra={
                    "method": method,
                    "route": route,
                    "path": request.path,
                    "status": status,
                    "duration_seconds": round(elapsed, 6),
                },
            )


class UnsizedBodyMiddleware:
    """A 411 in the error format for a body sent without its length (``Transfer-Encoding:
    chunked``, no ``Content-Length``).

    Django reads a body by its ``Content-Length`` alone: without one, it reads nothing, and
    the view would act on an empty body (a PATCH answered 200 having changed nothing, a
    claim made without the token sent). Before anything reads the body.
    """

    METHODS = frozenset({"POST", "PUT", "PATCH"})

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if (
            request.method in self.METHODS
            and request.META.get("HTTP_TRANSFER_ENCODING")
            and not request.META.get("CONTENT_LENGTH")
        ):
            return JsonResponse(
                error_body(
                    "length_required",
                    "Send the body with its Content-Length: a body sent in chunks is not read.",
                ),
                status=411,
            )
        return self.get_response(request)


class UnstorableTextMiddleware:
    """A 400 in the error format for a path, query string, form body or header holding U+0000.

    JSON bodies are checked by the API's parser (``common.parsers``); what Django decodes
    itself is checked here, for every view (the admin's forms and searches included).
    Lone surrogates cannot come out of these: Django decodes them from UTF-8 (replacing
    what does not decode) or, for headers, from Latin-1. A query string that does not
    decode is refused as well, rather than read with U+FFFD in place of what was sent.
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
        # A path is text too: a NUL in it reaches the lookups of the pages that take an id
        # or a key from it (the admin's change pages, the API's detail paths).
        if unstorable_path(request.path_info) is not None:
            return {"path": [PROBLEM]}
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
        undecodable = _undecodable_parameter(request)
        if undecodable is not None:
            return {undecodable: [UNDECODABLE]}
        sources = [request.GET]
        if (
            request.method == "POST"
            and request.content_type in self.FORM_TYPES
            and not is_api_path(request.path_info)
        ):
            # Parsed once; Django keeps it for the view. Not under the API, which reads
            # JSON only: its parser refuses a form (415), and a form read here would leave
            # it a body already consumed, parsed as empty.
            sources.append(request.POST)
        for source in sources:
            for key, values in source.lists():
                path = unstorable_path({key: values})
                if path is not None:
                    return {describe_path(path[:1]): [PROBLEM]}
        return None


UNDECODABLE = "Text must be UTF-8, and hold no lone surrogate (U+D800 to U+DFFF)."


def _undecodable_parameter(request) -> str | None:
    """The name of the first query parameter whose name or value, once its %-escapes are
    undone, is not text in the request's encoding (``%FF``, or ``%ED%A0%80``, a lone
    surrogate, in UTF-8); None when every one is.

    Django reads such bytes as U+FFFD without a word: ``?search=%FF`` would search for
    that character and answer 200.
    """
    encoding = request.GET.encoding
    for pair in request.META.get("QUERY_STRING", "").split("&"):
        name, _, value = pair.partition("=")
        try:
            for part in (name, value):
                unquote_to_bytes(part.replace("+", " ")).decode(encoding)
        except UnicodeDecodeError:
            return describe_path([unquote(name.replace("+", " "), errors="replace")[:200]])
    return None


# Where the API answers: every error here is JSON in the one format.
API_PATH_PREFIXES = ("/api/", "/health/")

_CODES = {
    400: "bad_request",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    500: "internal_error",
}


def is_api_path(path: str) -> bool:
    return path.startswith(API_PATH_PREFIXES) or f"{path}/" in API_PATH_PREFIXES


class ApiErrorMiddleware:
    """Under the API's paths, an error that DRF did not answer is still JSON in the one format.

    DRF's exception handler covers its views. What it does not see is answered by Django:
    an unknown path or a wrong method of a plain view (/health/), an exception while a
    response is rendered, a refusal of another middleware. Django answers those with HTML,
    and with DEBUG on with its debug page, which prints settings and the environment.
    This middleware, outermost, turns them into the API's format, DEBUG or not; the error
    itself is logged as Django would have logged it.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            response.status_code >= 400
            and is_api_path(request.path_info)
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            return self._json_error(response.status_code, source=response)
        return response

    def process_exception(self, request, exception):
        """A view's exception that DRF did not handle (a plain view, a failed rendering)."""
        from django.core.exceptions import BadRequest, PermissionDenied
        from django.http import Http404

        if not is_api_path(request.path_info):
            return None
        if isinstance(exception, Http404):
            status = 404
        elif isinstance(exception, PermissionDenied):
            status = 403
        elif isinstance(exception, RequestDataTooBig):
            status = 413
        elif isinstance(exception, BadRequest | SuspiciousOperation):
            status = 400
        else:
            logger.error("Internal Server Error: %s", request.path, exc_info=exception)
            status = 500
        response = self._json_error(status)
        # Logged above (or not an error of ours): django.request need not log it again.
        response._has_been_logged = True
        return response

    @staticmethod
    def _json_error(status: int, *, source=None):
        from http import HTTPStatus

        try:
            message = HTTPStatus(status).phrase + "."
        except ValueError:
            message = "The request failed."
        response = JsonResponse(error_body(_CODES.get(status, "error"), message), status=status)
        if source is not None:
            # What the client needs to act on: the methods allowed, when to come back.
            for header in ("Allow", "Retry-After", "WWW-Authenticate"):
                if source.has_header(header):
                    response[header] = source[header]
            response._has_been_logged = getattr(source, "_has_been_logged", False)
        return response
