"""The hub's worker API, as the automation worker calls it (HTTP, worker credential).

A request made for a job (``for_job``) carries the job's ids to the hub: its correlation id
as ``X-Request-ID`` (the hub's log lines of a claim, a heartbeat or a report carry the id
of the request that created the job) and its trace as ``traceparent`` (the current span's
while tracing is on here, else the job's own, from its message or the poll), so that the
hub's spans of the claim and the report join the job's trace.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from common import tracing

logger = logging.getLogger("hubdommed.agent")


@dataclass(frozen=True)
class JobIds:
    """What the job's message (or the poll) told of it: the ids its requests and log lines
    carry."""

    correlation_id: str | None = None
    tenant_id: int | None = None
    traceparent: str | None = None

    def filled_from(self, other: JobIds) -> JobIds:
        """These ids, with what they lack taken from ``other`` (the poll knows no tenant)."""
        return JobIds(
            correlation_id=self.correlation_id or other.correlation_id,
            tenant_id=self.tenant_id if self.tenant_id is not None else other.tenant_id,
            traceparent=self.traceparent or other.traceparent,
        )


# The job the current thread's requests are for (``for_job``).
_job_ids: ContextVar[JobIds | None] = ContextVar("agent_job_ids", default=None)


@contextmanager
def for_job(ids: JobIds | None) -> Iterator[None]:
    """The requests made in the block, by this thread, carry the job's ids."""
    token = _job_ids.set(ids)
    try:
        yield
    finally:
        _job_ids.reset(token)


def _headers() -> dict[str, str] | None:
    ids = _job_ids.get()
    headers: dict[str, str] = {}
    tracing.inject(headers)
    if ids is not None:
        if ids.traceparent and "traceparent" not in headers:
            headers["traceparent"] = ids.traceparent
        if ids.correlation_id:
            headers["X-Request-ID"] = ids.correlation_id
    return headers or None


class HubError(Exception):
    """The hub answered with an error, or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    @property
    def retryable(self) -> bool:
        """The hub was unreachable, overloaded or failing: the same request may succeed
        later. Any other answer (a refusal) will not change by sending it again."""
        return self.status is None or self.status >= 500 or self.status == 429

    @property
    def credential_refused(self) -> bool:
        """This worker's credential no longer works (rotated, or the worker retired)."""
        return self.status == 401


class ClaimRefused(HubError):
    """An expected refusal (already_claimed, concurrency_limit, not_pending)."""


@dataclass(frozen=True)
class AutomationInfo:
    id: int
    slug: str
    command: list[str]
    timeout_seconds: int
    max_concurrency: int


class HubClient:
    def __init__(self, base_url: str, credential: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/") + "/api/v1"
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {credential}"
        # Connection failures are retried a few times quickly; answers are never re-sent
        # (a claim or a report that reached the hub must not be repeated blindly).
        retry = Retry(total=3, connect=3, read=0, status=0, backoff_factor=0.2)
        self.session.mount("http://", HTTPAdapter(max_retries=retry))
        self.session.mount("https://", HTTPAdapter(max_retries=retry))

    def close(self) -> None:
        self.session.close()

    def me(self) -> AutomationInfo:
        body = self._call("GET", "/worker/me")
        try:
            automation = body["automation"]
            return AutomationInfo(
                id=automation["id"],
                slug=automation["slug"],
                command=list(automation["command"]),
                timeout_seconds=int(automation["timeout_seconds"]),
                max_concurrency=int(automation["max_concurrency"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise HubError(f"GET /worker/me: an answer without the automation: {exc!r}") from exc

    def pending_jobs(self, *, limit: int = 20) -> list[dict[str, Any]]:
        """The automation's pending jobs, oldest first: ``{"id", "created_at", "traceparent"}``."""
        return self._call("GET", "/worker/jobs", params={"limit": limit}, answer=list)

    def claim(self, job_id: int, *, claim_token: str | None = None) -> dict[str, Any]:
        """Claim the job; named by ``claim_token``, the same claim may be sent again when
        its answer is lost (the hub answers it again instead of refusing it)."""
        body = {"claim_token": claim_token} if claim_token else None
        job = self._call("POST", f"/jobs/{job_id}/start", refusal=ClaimRefused, json=body)
        if not isinstance(job, dict) or "claim_token" not in job:
            raise HubError(f"POST /jobs/{job_id}/start: an answer without the claim")
        return job

    def heartbeat(self, job_id: int, claim_token: str, progress: Any = None) -> dict[str, Any]:
        return self._call(
            "POST",
            f"/jobs/{job_id}/heartbeat",
            json={"claim_token": claim_token, "progress": progress},
        )

    def output(self, job_id: int, claim_token: str, *, seq: int, text: str) -> dict[str, Any]:
        return self._call(
            "POST",
            f"/jobs/{job_id}/output",
            json={"claim_token": claim_token, "seq": seq, "text": text},
        )

    def complete(self, job_id: int, claim_token: str, **report: Any) -> dict[str, Any]:
        return self._call(
            "POST", f"/jobs/{job_id}/complete", json={"claim_token": claim_token, **report}
        )

    def fail(self, job_id: int, claim_token: str, **report: Any) -> dict[str, Any]:
        return self._call(
            "POST", f"/jobs/{job_id}/fail", json={"claim_token": claim_token, **report}
        )

    def _call(
        self, method: str, path: str, *, refusal=HubError, answer: type = dict, **kwargs: Any
    ) -> Any:
        """The hub's answer, a JSON ``answer`` (every worker call answers an object, the
        poll a list). Anything else is a ``HubError``: a refusal, or, retryable, the hub
        unreachable or an answer it never gives (cut short, empty, a proxy's page)."""
        try:
            response = self.session.request(
                method, self.base_url + path, timeout=self.timeout, headers=_headers(), **kwargs
            )
        except requests.RequestException as exc:
            raise HubError(f"{method} {path}: hub unreachable: {exc}") from exc
        if response.status_code < 400:
            try:
                body = response.json()
            except ValueError as exc:
                # An answer cut short (the hub or the network went away mid-answer).
                raise HubError(f"{method} {path}: unreadable answer: {exc}") from exc
            if not isinstance(body, answer):
                raise HubError(
                    f"{method} {path}: a {response.status_code} answer that is not a JSON "
                    f"{'list' if answer is list else 'object'}: {response.text[:200]!r}"
                )
            return body
        try:
            error = response.json()["error"]
            code, message = error["code"], error["message"]
        except (ValueError, KeyError, TypeError):
            code, message = "", response.text[:200]
        cls = refusal if response.status_code == 409 else HubError
        raise cls(
            f"{method} {path}: {response.status_code} {code}: {message}",
            status=response.status_code,
            code=code,
        )
