"""One webhook request, made safely on a tenant's behalf.

A tenant chooses the URL, so the request must never reach what only the hub can reach:
loopback, private networks, link-local addresses (the cloud's metadata service among them)
or any other non-global address. The host is resolved here, every address checked, and the
connection made to the checked address itself (the Host header and TLS's SNI and certificate
check keep the name): no second lookup, so no DNS-rebinding window between the check and the
connect. Redirects are not followed unless ``WEBHOOK_MAX_REDIRECTS`` allows it, and then each
hop is checked the same way. Timeouts are short and the answer's body is read only up to a
bound, so a receiver costs a worker slot for seconds at most.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import certifi
import urllib3
from django.conf import settings
from urllib3.exceptions import HTTPError, NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

# The cloud metadata services: never reachable, whatever the settings allow.
METADATA_NETWORKS = (
    ipaddress.ip_network("169.254.0.0/16"),  # AWS, GCP, Azure (and all IPv4 link-local)
    ipaddress.ip_network("fd00:ec2::/32"),  # AWS over IPv6
    ipaddress.ip_network("fe80::/10"),
)
# NAT64 embeds an IPv4 address in the last 32 bits: 64:ff9b::7f00:1 is 127.0.0.1.
NAT64 = ipaddress.ip_network("64:ff9b::/96")

REDIRECTS = (301, 302, 303, 307, 308)
# Only these keep the method and the body: a webhook is never turned into a GET.
FOLLOWED_REDIRECTS = (307, 308)


class RefusedAddress(Exception):
    """The URL's host is, or resolves to, an address deliveries may not reach."""


@dataclass(frozen=True)
class Answer:
    """What came of one request: a status code, or an error (never both)."""

    status_code: int | None
    latency_ms: int
    error: str = ""
    excerpt: str = ""
    retry_after: float | None = None
    # The error is the hub's refusal (an address, a scheme), not the receiver's failure.
    refused: bool = False
    timed_out: bool = False


def address_allowed(address: str, *, allow_private: bool) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        return address_allowed(str(embedded), allow_private=allow_private)
    if any(ip in network for network in METADATA_NETWORKS if network.version == ip.version):
        return False
    if ip.is_multicast or ip.is_unspecified:
        return False
    return (ip.is_global and not ip.is_reserved) or allow_private


def _embedded_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address):
    if ip.version != 6:
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def allowed_schemes() -> tuple[str, ...]:
    # Plain HTTP only where private addresses are allowed: development and tests.
    return ("https", "http") if settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES else ("https",)


def check_url(url: str) -> str | None:
    """Why ``url`` cannot be an endpoint (None: it can, as far as can be told without DNS)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a valid URL: {exc}"
    if parts.scheme not in allowed_schemes():
        return f"the URL must use {' or '.join(allowed_schemes())}"
    if not parts.hostname:
        return "the URL has no host"
    if parts.username is not None or parts.password is not None:
        return "the URL may not carry credentials"
    if parts.fragment:
        return "the URL may not have a fragment"
    if port == 0:
        return "the URL's port is invalid"
    host = parts.hostname
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if (
            host == "localhost" or host.endswith(".localhost")
        ) and not settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES:
            return "the URL's host is not a public address"
        return None
    if not address_allowed(host, allow_private=settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES):
        return "the URL's host is not a public address"
    return None


def resolve(host: str, port: int) -> str:
    """The first address of ``host`` a delivery may reach; RefusedAddress if none."""
    allow_private = settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConnectionError(f"could not resolve {host}: {exc}") from None
    addresses = [info[4][0] for info in infos]
    for address in addresses:
        if address_allowed(address, allow_private=allow_private):
            return address
    raise RefusedAddress(f"{host} resolves to no public address ({', '.join(addresses)})")


def post(url: str, body: bytes, headers: dict[str, str]) -> Answer:
    """POST ``body`` to ``url``: checked addresses only, short timeouts, a bounded read."""
    started = time.monotonic()
    deadline = started + settings.WEBHOOK_TIMEOUT

    def elapsed_ms() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        for _hop in range(settings.WEBHOOK_MAX_REDIRECTS + 1):
            status, excerpt, location, retry_after = _post_once(url, body, headers, deadline)
            if status in FOLLOWED_REDIRECTS and location and _hop < settings.WEBHOOK_MAX_REDIRECTS:
                url = urljoin(url, location)
                reason = check_url(url)
                if reason:
                    raise RefusedAddress(f"redirect refused: {reason}")
                continue
            error = ""
            if status in REDIRECTS:
                error = f"redirect to {location or '?'} not followed"
            return Answer(status, elapsed_ms(), error, excerpt, retry_after)
    except RefusedAddress as exc:
        return Answer(None, elapsed_ms(), f"refused: {exc}", refused=True)
    except NewConnectionError as exc:
        # (a subclass of urllib3's timeout error, for old reasons: a refusal is not a timeout)
        return Answer(None, elapsed_ms(), f"connection error: {exc}")
    except (Urllib3Timeout, TimeoutError) as exc:
        return Answer(None, elapsed_ms(), f"timeout: {exc}", timed_out=True)
    except (HTTPError, OSError, ConnectionError, ssl.SSLError) as exc:
        return Answer(None, elapsed_ms(), f"connection error: {type(exc).__name__}: {exc}")
    raise AssertionError("unreachable")  # pragma: no cover


def _post_once(
    url: str, body: bytes, headers: dict[str, str], deadline: float
) -> tuple[int, str, str, float | None]:
    parts = urlsplit(url)
    reason = check_url(url)
    if reason:
        raise RefusedAddress(reason)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = resolve(host, port)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("no time left for the request")
    timeout = urllib3.Timeout(
        connect=min(settings.WEBHOOK_CONNECT_TIMEOUT, remaining),
        read=min(settings.WEBHOOK_READ_TIMEOUT, remaining),
    )
    host_header = parts.netloc.rsplit("@", 1)[-1]
    pool_args = {"timeout": timeout, "retries": False, "maxsize": 1, "block": False}
    if parts.scheme == "https":
        # Connected to the checked address; the name still drives SNI and the certificate.
        pool = urllib3.HTTPSConnectionPool(
            address,
            port,
            server_hostname=host,
            assert_hostname=host,
            cert_reqs="CERT_REQUIRED",
            ca_certs=settings.WEBHOOK_CA_BUNDLE or certifi.where(),
            **pool_args,
        )
    else:
        pool = urllib3.HTTPConnectionPool(address, port, **pool_args)
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    try:
        response = pool.urlopen(
            "POST",
            path,
            body=body,
            headers={**headers, "Host": host_header},
            redirect=False,
            preload_content=False,
            assert_same_host=False,
        )
        try:
            excerpt = _read_bounded(response, deadline)
            return (
                response.status,
                excerpt,
                response.headers.get("Location", ""),
                _retry_after(response.headers.get("Retry-After")),
            )
        finally:
            response.release_conn()
    finally:
        pool.close()


def _read_bounded(response, deadline: float) -> str:
    """At most WEBHOOK_MAX_RESPONSE_BYTES of the body, within the deadline; the rest is
    left unread (the connection is closed, not drained)."""
    limit = settings.WEBHOOK_MAX_RESPONSE_BYTES
    chunks, size = [], 0
    while size < limit and time.monotonic() < deadline:
        chunk = response.read(min(4096, limit - size), decode_content=False)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # the HTTP-date form: the schedule's own delay stands
    return seconds if seconds >= 0 else None
