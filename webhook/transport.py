"""One webhook request, made safely on a tenant's behalf.

A tenant chooses the URL, so the request must never reach what only the hub can reach:
loopback, private networks, link-local addresses (the cloud's metadata service among them)
or any other non-global address. The host is resolved here, every address checked, and the
connection made to the checked address itself (the Host header and TLS's SNI and certificate
check keep the name): no second lookup, so no DNS-rebinding window between the check and the
connect. Redirects are not followed unless ``WEBHOOK_MAX_REDIRECTS`` allows it, and then each
hop is checked the same way. Timeouts are short and the answer's body is read only up to a
bound, so a receiver costs a worker slot for seconds at most: the request's whole time is
bounded by the clock (``WEBHOOK_TIMEOUT``, the host's lookup included), not only each read,
since a receiver that sends a byte now and then meets every read timeout (``_Cutoff``).
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import heapq
import http.client
import ipaddress
import itertools
import logging
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from datetime import UTC
from urllib.parse import urljoin, urlsplit

import certifi
import idna
import urllib3
import urllib3.connection
from django.conf import settings
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    InvalidChunkLength,
    InvalidHeader,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.util.ssl_match_hostname import CertificateError as CertificateNameError

from common.jsondata import storable_text

# The cloud metadata services: never reachable, whatever the settings allow.
METADATA_NETWORKS = (
    ipaddress.ip_network("169.254.0.0/16"),  # AWS, GCP, Azure (and all IPv4 link-local)
    ipaddress.ip_network("fd00:ec2::/32"),  # AWS over IPv6
    ipaddress.ip_network("fe80::/10"),
)
# Not globally reachable by IANA's special-purpose registries, yet ``is_global`` in the
# ipaddress of Python 3.11 (its tables are older than these entries).
NOT_GLOBAL_NETWORKS = (
    ipaddress.ip_network("192.0.0.0/24"),  # IETF protocol assignments
    ipaddress.ip_network("fec0::/10"),  # site-local: deprecated, still routed inside some sites
    ipaddress.ip_network("3fff::/20"),  # documentation (RFC 9637)
    ipaddress.ip_network("5f00::/16"),  # segment routing SIDs (RFC 9602)
)
# NAT64 embeds an IPv4 address in the last 32 bits: 64:ff9b::7f00:1 is 127.0.0.1 (the
# well-known prefix, and the local-use one of RFC 8215).
NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
# IPv4-compatible addresses (deprecated): ::7f00:1 is 127.0.0.1.
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")

REDIRECTS = (301, 302, 303, 307, 308)
# Only these keep the method and the body: a webhook is never turned into a GET.
FOLLOWED_REDIRECTS = (307, 308)
# What the tenant reads in a delivery's error when its host is refused: the resolver's
# answer (the hub's view of its own network) goes to the hub's log only.
NOT_PUBLIC = "the address is not public"
UNRESOLVED = "the name did not resolve"

logger = logging.getLogger("hubdommed.webhook")


class RefusedAddress(Exception):
    """The URL's host is, or resolves to, an address deliveries may not reach."""


class Unresolved(ConnectionError):
    """The URL's host did not resolve (retried: a name may resolve again)."""


class InvalidHost(ValueError):
    """The URL's host is no name or address a resolver would read one way."""


@dataclass(frozen=True)
class Answer:
    """What came of one request: a status code, or an error (never both). Its texts are
    storable: U+0000 and lone surrogates are U+FFFD."""

    status_code: int | None
    latency_ms: int
    error: str = ""
    excerpt: str = ""
    retry_after: float | None = None
    # The error is the hub's refusal (an address, a scheme), not the receiver's failure.
    refused: bool = False
    timed_out: bool = False

    def __post_init__(self) -> None:
        # The receiver's body, a header it sent (a redirect's Location, quoted in the
        # error) and an exception's message are anyone's text: PostgreSQL refuses U+0000
        # in the attempt's and the delivery's columns, and a failed INSERT would leave the
        # delivery pending, sent again by every new run. Made storable once, here.
        object.__setattr__(self, "error", storable_text(self.error))
        object.__setattr__(self, "excerpt", storable_text(self.excerpt))


# --- the host ---------------------------------------------------------------------------------

# A label of a name in its ASCII form: letters, digits, hyphens (and the underscore that
# service names such as _dmarc carry; DNS has no objection to it).
_ASCII_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")


def canonical_host(host: str) -> str:
    """The one form of ``host`` that the hub decides on and connects to; InvalidHost if
    a resolver could read it in more ways than one, or not at all.

    A URL's host may be written many ways that name the same place: ``127.1``,
    ``2130706433`` and ``0x7f000001`` are all 127.0.0.1 to ``inet_aton`` (and so to
    ``getaddrinfo``); full-width digits and dots, upper case and a trailing dot are folded
    by IDNA's UTS-46 mapping; a Unicode name travels as its A-label (``xn--...``). So the
    guard decides on what the connection will use, here, at registration and at delivery
    alike. IPv4 is read the way WHATWG's URL standard reads it (a host whose last label is
    a number is an IPv4 address or nothing), which is also every form ``inet_aton`` takes.
    Names go through the ``idna`` package (IDNA 2008 with UTS-46), not the standard
    library's codec: that one implements IDNA 2003, which maps some names (``ß``, ``ς``)
    to another name than browsers and registries do.
    """
    if ":" in host:
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError as exc:
            raise InvalidHost(f"not a valid IPv6 address: {exc}") from None
    try:
        mapped = idna.uts46_remap(host, std3_rules=False, transitional=False)
    except idna.IDNAError as exc:
        raise InvalidHost(f"not a valid host name: {exc}") from None
    mapped = mapped.removesuffix(".")
    labels = mapped.split(".")
    if _NUMBER.fullmatch(labels[-1]):
        return str(_ipv4(labels))
    if len(mapped) > 253:
        raise InvalidHost("the host name is longer than 253 characters")
    return ".".join(_a_label(label) for label in labels)


def _ipv4(parts: list[str]) -> ipaddress.IPv4Address:
    """An IPv4 address in any form inet_aton takes: 1 to 4 parts, each decimal, octal
    (a leading 0) or hexadecimal (0x); the last part fills the bytes the others left."""
    if len(parts) > 4:
        raise InvalidHost("not a valid IPv4 address: more than 4 parts")
    numbers = []
    for part in parts:
        if not _NUMBER.fullmatch(part):
            raise InvalidHost(f"not a valid IPv4 address: {part!r} is not a number")
        if part[:2].lower() == "0x":
            numbers.append(int(part[2:] or "0", 16))
        elif len(part) > 1 and part.startswith("0"):
            try:
                numbers.append(int(part, 8))
            except ValueError:
                raise InvalidHost(f"not a valid IPv4 address: {part!r} is not octal") from None
        else:
            numbers.append(int(part))
    *leading, last = numbers
    if any(number > 255 for number in leading) or last >= 256 ** (5 - len(numbers)):
        raise InvalidHost("not a valid IPv4 address: a part is out of range")
    value = last
    for position, number in enumerate(leading):
        value += number << (8 * (3 - position))
    return ipaddress.IPv4Address(value)


def _a_label(label: str) -> str:
    if label.isascii() and not label.startswith("xn--"):
        if not _ASCII_LABEL.fullmatch(label):
            raise InvalidHost(f"not a valid host name: the label {label!r}")
        return label
    try:
        return idna.alabel(label).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        raise InvalidHost(f"not a valid host name: {exc}") from None


def address_allowed(address: str, *, allow_private: bool) -> bool:
    """Whether a delivery may connect to ``address`` (an IP address in any form)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        return address_allowed(str(embedded), allow_private=allow_private)
    if any(ip in network for network in METADATA_NETWORKS if network.version == ip.version):
        return False
    if ip.is_multicast or ip.is_unspecified:
        return False
    if any(ip in network for network in NOT_GLOBAL_NETWORKS if network.version == ip.version):
        return allow_private
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
    if any(ip in network for network in NAT64) or (
        ip in IPV4_COMPATIBLE and int(ip) > 1  # (not :: nor ::1, which are themselves)
    ):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def allowed_schemes() -> tuple[str, ...]:
    # Plain HTTP only where private addresses are allowed: development and tests.
    return ("https", "http") if settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES else ("https",)


@dataclass(frozen=True)
class Target:
    """Where one request goes: the URL's parts with its host in canonical form."""

    scheme: str
    host: str  # canonical: an A-label name, or an address
    port: int
    # The Host header: the canonical host, and the port when the URL names one.
    authority: str
    path: str
    is_address: bool


def target_of(url: str) -> Target:
    """The checked target of ``url``; RefusedAddress says why there is none. One function
    for registration and delivery, so both decide on the same canonical host."""
    return _target_of(url, settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES)


# The reading of a URL depends on nothing else: kept, not worked out again on every
# request (a refusal is not kept, and comes out the same each time).
@functools.lru_cache(maxsize=1024)
def _target_of(url: str, allow_private: bool) -> Target:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RefusedAddress(f"not a valid URL: {exc}") from None
    schemes = ("https", "http") if allow_private else ("https",)  # as allowed_schemes()
    if parts.scheme not in schemes:
        raise RefusedAddress(f"the URL must use {' or '.join(schemes)}")
    if not parts.hostname:
        raise RefusedAddress("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise RefusedAddress("the URL may not carry credentials")
    if parts.fragment:
        raise RefusedAddress("the URL may not have a fragment")
    if port == 0:
        raise RefusedAddress("the URL's port is invalid")
    try:
        host = canonical_host(parts.hostname)
    except InvalidHost as exc:
        raise RefusedAddress(f"the URL's host is invalid: {exc}") from None
    try:
        ipaddress.ip_address(host)
        is_address = True
    except ValueError:
        is_address = False
    if is_address:
        if not address_allowed(host, allow_private=allow_private):
            raise RefusedAddress("the URL's host is not a public address")
    elif (host == "localhost" or host.endswith(".localhost")) and not allow_private:
        raise RefusedAddress("the URL's host is not a public address")
    authority = f"[{host}]" if ":" in host else host
    if port is not None:
        authority = f"{authority}:{port}"
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(
        scheme=parts.scheme,
        host=host,
        port=port or (443 if parts.scheme == "https" else 80),
        authority=authority,
        path=path,
        is_address=is_address,
    )


def check_url(url: str) -> str | None:
    """Why ``url`` cannot be an endpoint (None: it can, as far as can be told without DNS)."""
    try:
        target_of(url)
    except RefusedAddress as exc:
        return str(exc)
    return None


class LookupTimedOut(TimeoutError):
    """The host's lookup did not end before the request's time limit."""


def resolve(host: str, port: int, deadline: float | None = None) -> str:
    """The first address of ``host`` (canonical) a delivery may reach; RefusedAddress if
    none, Unresolved if the name has no address, LookupTimedOut if the lookup outlasts
    ``deadline`` (monotonic). Their messages are the tenant's to read; what the resolver
    answered is logged for the operators."""
    allow_private = settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES
    try:
        infos = _getaddrinfo(host, port, deadline)
    except (socket.gaierror, UnicodeError) as exc:
        logger.warning("webhook host %s did not resolve: %s", host, exc)
        raise Unresolved(UNRESOLVED) from None
    addresses = [info[4][0] for info in infos]
    for address in addresses:
        if address_allowed(address, allow_private=allow_private):
            return address
    logger.warning(
        "webhook host %s refused: it resolves to no public address (%s)",
        host,
        ", ".join(addresses),
    )
    raise RefusedAddress(NOT_PUBLIC)


def _getaddrinfo(host: str, port: int, deadline: float | None) -> list:
    """``getaddrinfo`` waited for until ``deadline`` at most. The lookup cannot be
    interrupted, and how long it takes is the tenant's name servers' choice (the C
    resolver gives up after its own timeouts and attempts, half a minute and more): so it
    runs on a thread of its own, left to end by itself if the request gives up on it. Such
    a thread lives as long as the resolver's own timeout, and a receiver whose lookups
    time out is tried one attempt at a time, so they stay few."""
    if deadline is None:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    outcome: list = []

    def lookup() -> None:
        try:
            outcome.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as exc:  # raised again on the request's thread
            outcome.append(exc)

    thread = threading.Thread(target=lookup, name="webhook-lookup", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if not outcome:
        raise LookupTimedOut(f"the lookup of {host} did not end in time")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def post(url: str, body: bytes, headers: dict[str, str]) -> Answer:
    """POST ``body`` to ``url``: checked addresses only, short timeouts, a bounded read.

    An error is told in the tenant's terms (the receiver refused the connection, did not
    answer in time, showed a certificate for another name): never what the hub's resolver
    answered nor the address it connected to, which the hub's log keeps.
    """
    started = time.monotonic()
    deadline = started + settings.WEBHOOK_TIMEOUT

    def elapsed_ms() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        with cutoffs.armed(deadline) as cutoff:
            for _hop in range(settings.WEBHOOK_MAX_REDIRECTS + 1):
                status, excerpt, location, retry_after = _post_once(
                    url, body, headers, deadline, cutoff
                )
                if (
                    status in FOLLOWED_REDIRECTS
                    and location
                    and _hop < settings.WEBHOOK_MAX_REDIRECTS
                ):
                    try:
                        url = urljoin(url, location)
                    except ValueError as exc:  # the receiver's text: "http://[::1", say
                        raise RefusedAddress(f"redirect refused: not a valid URL: {exc}") from None
                    reason = check_url(url)
                    if reason:
                        raise RefusedAddress(f"redirect refused: {reason}")
                    continue
                error = ""
                if status in REDIRECTS:
                    error = f"redirect to {location or '?'} not followed"
                    if status in FOLLOWED_REDIRECTS and settings.WEBHOOK_MAX_REDIRECTS:
                        error += f": more than {settings.WEBHOOK_MAX_REDIRECTS} redirects"
                return Answer(status, elapsed_ms(), error, excerpt, retry_after)
    except RefusedAddress as exc:
        return Answer(None, elapsed_ms(), f"refused: {exc}", refused=True)
    except Unresolved as exc:
        return Answer(None, elapsed_ms(), f"connection error: {exc}")
    except LookupTimedOut as exc:
        logger.info("webhook POST to %s failed: %s", url, exc)
        error = f"timeout: the name did not resolve within {settings.WEBHOOK_TIMEOUT:g} s"
        return Answer(None, elapsed_ms(), error, timed_out=True)
    except (HTTPError, OSError, ssl.SSLError) as exc:
        logger.info("webhook POST to %s failed: %s: %s", url, type(exc).__name__, exc)
        if cutoff.fired:
            # Whatever the cut connection raised, the time limit is what ended it.
            return Answer(None, elapsed_ms(), _took_too_long(), timed_out=True)
        error, timed_out = _described(exc)
        return Answer(None, elapsed_ms(), error, timed_out=timed_out)
    raise AssertionError("unreachable")  # pragma: no cover


def _described(exc: BaseException) -> tuple[str, bool]:
    """The tenant's reading of a failed request, and whether it was a timeout. urllib3's
    own messages name the pool's host, which is the address connected to: not used."""
    if isinstance(exc, NewConnectionError):
        # (a subclass of urllib3's timeout error, for old reasons: a refusal is not a timeout)
        cause = _in_chain(exc, OSError)
        reason = getattr(cause, "strerror", None) or "the receiver could not be reached"
        return f"connection error: could not connect: {reason}", False
    if isinstance(exc, ConnectTimeoutError):
        return f"timeout: no connection within {settings.WEBHOOK_CONNECT_TIMEOUT:g} s", True
    if isinstance(exc, ReadTimeoutError):
        return f"timeout: no answer within {settings.WEBHOOK_READ_TIMEOUT:g} s", True
    if isinstance(exc, Urllib3Timeout | TimeoutError):
        return _took_too_long(), True
    certificate = _in_chain(exc, ssl.SSLCertVerificationError)
    if certificate is not None:
        why = certificate.verify_message or "it could not be verified"
        return f"connection error: the receiver's certificate was refused: {why}", False
    mismatch = _in_chain(exc, CertificateNameError)
    if mismatch is not None:
        # Names only: the URL's (in its A-label form) and the certificate's.
        return f"connection error: the receiver's certificate was refused: {mismatch}", False
    if _in_chain(exc, ssl.SSLError) is not None:
        return "connection error: the TLS handshake failed", False
    malformed = _malformed(exc)
    if malformed:
        return f"connection error: {malformed}", False
    if isinstance(exc, ProtocolError):
        return "connection error: the connection closed before an answer", False
    return "connection error: the request failed", False


def _malformed(exc: BaseException) -> str:
    """What was wrong with an answer that came but could not be read as HTTP ("" if that
    is not what ``exc`` says): a receiver on another protocol's port, a head larger than
    the client reads (100 headers, 64 KiB a line), a body cut short, a broken framing."""
    if _in_chain(exc, http.client.RemoteDisconnected) is not None:
        return ""  # (a BadStatusLine too, for old reasons: nothing came at all)
    if _in_chain(exc, http.client.BadStatusLine) is not None:
        return "the answer is not HTTP"
    too_long = _in_chain(exc, http.client.LineTooLong)
    if too_long is not None and ("header" in str(too_long) or "status" in str(too_long)):
        return "the answer's head is too large"
    if any(
        # (how http.client says "more than 100 headers": the base class, and a message)
        type(link) is http.client.HTTPException and str(link).startswith("got more than")
        for link in _chain(exc)
    ):
        return "the answer's head is too large"
    if _in_chain(exc, InvalidChunkLength) is not None or too_long is not None:
        return "the answer is not valid HTTP"
    if _in_chain(exc, http.client.IncompleteRead) is not None:
        return "the answer's body was cut short or malformed"
    if _in_chain(exc, InvalidHeader | http.client.UnknownProtocol) is not None:
        return "the answer is not valid HTTP"
    return ""


def _in_chain(exc: BaseException, kind) -> BaseException | None:
    """The first exception of ``kind`` among ``exc``, its causes and arguments."""
    return next((link for link in _chain(exc) if isinstance(link, kind)), None)


def _chain(exc: BaseException):
    """``exc``, then its arguments and causes that are exceptions, breadth first."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend(arg for arg in current.args if isinstance(arg, BaseException))
        pending.extend(link for link in (current.__cause__, current.__context__) if link)


# --- kept connections -----------------------------------------------------------------------
# One pool of connections per receiver: its scheme, the address checked for this request,
# its port, and the name SNI and the certificate check use (with the CA bundle that checks
# it). A pooled connection is only ever reused for the very address the request's own
# check allowed: a name that resolves elsewhere next time (DNS rebinding) gets another
# pool, and its new connections go to the address checked then.
POOL_CONNECTIONS = 4  # kept per receiver (a worker process has this many slots by default)
POOLS_KEPT = 256  # receivers a worker process keeps connections to; the least recent go
POOL_IDLE_SECONDS = 4.0  # a receiver's connections unused this long are closed
# (shorter than the common servers' keep-alive: Node's 5 s, nginx's 75 s), so that a
# connection is rarely reused just as the receiver closes it.


@dataclass(frozen=True)
class _PoolKey:
    scheme: str
    address: str
    port: int
    server_name: str
    ca_bundle: str


class _Pools:
    """The worker process's kept connections, bounded: ``POOLS_KEPT`` receivers of
    ``POOL_CONNECTIONS`` each (more at once are made and closed after use), closed when
    idle for ``POOL_IDLE_SECONDS``."""

    def __init__(self) -> None:
        self._pools: dict[_PoolKey, tuple[urllib3.HTTPConnectionPool, float]] = {}
        self._lock = threading.Lock()
        self._swept = time.monotonic()

    def get(self, key: _PoolKey) -> urllib3.HTTPConnectionPool:
        now = time.monotonic()
        closing: list[urllib3.HTTPConnectionPool] = []
        with self._lock:
            entry = self._pools.pop(key, None)
            if entry is not None and now - entry[1] > POOL_IDLE_SECONDS:
                closing.append(entry[0])
                entry = None
            pool = entry[0] if entry is not None else _new_pool(key)
            # Re-inserted last: the dict's order is the least recently used first.
            self._pools[key] = (pool, now)
            while len(self._pools) > POOLS_KEPT:
                oldest = next(iter(self._pools))
                closing.append(self._pools.pop(oldest)[0])
            if now - self._swept > POOL_IDLE_SECONDS:
                self._swept = now
                idle = [k for k, (_, used) in self._pools.items() if now - used > POOL_IDLE_SECONDS]
                closing.extend(self._pools.pop(idle_key)[0] for idle_key in idle)
        for old in closing:
            old.close()
        return pool

    def close(self) -> None:
        with self._lock:
            pools = [pool for pool, _ in self._pools.values()]
            self._pools.clear()
        for pool in pools:
            pool.close()

    def __len__(self) -> int:
        return len(self._pools)


def _new_pool(key: _PoolKey) -> urllib3.HTTPConnectionPool:
    pool_args = {"retries": False, "maxsize": POOL_CONNECTIONS, "block": False}
    if key.scheme == "https":
        # Connected to the checked address; the name, in its A-label form, still drives
        # SNI and the certificate check, on every new connection of the pool.
        return _HTTPSPool(
            key.address,
            key.port,
            server_hostname=key.server_name,
            assert_hostname=key.server_name,
            cert_reqs="CERT_REQUIRED",
            ca_certs=key.ca_bundle,
            **pool_args,
        )
    return _HTTPPool(key.address, key.port, **pool_args)


# --- the time limit, by the clock ------------------------------------------------------------


def _took_too_long() -> str:
    return f"timeout: the request took longer than {settings.WEBHOOK_TIMEOUT:g} s"


class _Cutoff:
    """One request's time limit. The connection the request uses (each hop's) is handed
    over as it connects and as it sends; at the limit its socket is shut down, which ends
    the read waiting on it (the status line, a header, the body, a TLS handshake)."""

    __slots__ = ("_connection", "_lock", "done", "fired")

    def __init__(self) -> None:
        self.fired = False
        # The request ended first: nothing to cut.
        self.done = False
        self._connection: urllib3.connection.HTTPConnection | None = None
        self._lock = threading.Lock()

    def watch(self, connection: urllib3.connection.HTTPConnection) -> None:
        with self._lock:
            self._connection = connection
            fired = self.fired
        if fired:
            _cut(connection)

    def fire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.fired = True
            connection = self._connection
        if connection is not None:
            _cut(connection)

    def finish(self) -> None:
        with self._lock:
            self.done = True
            self._connection = None


def _cut(connection: urllib3.connection.HTTPConnection) -> None:
    sock = getattr(connection, "sock", None)
    if sock is None:
        return  # still connecting: its own timeout bounds that
    with contextlib.suppress(OSError):
        # The plain socket's shutdown, also for TLS: ``SSLSocket.shutdown`` would unwrap
        # the socket under the thread reading it.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Cutoffs:
    """The process's armed time limits, fired by one thread at their times."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Cutoff]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._local = threading.local()

    @contextlib.contextmanager
    def armed(self, at: float):
        """A time limit at ``at`` (monotonic) for the requests this thread makes in the block."""
        cutoff = _Cutoff()
        with self._changed:
            heapq.heappush(self._heap, (at, next(self._order), cutoff))
            if self._thread is None or not self._thread.is_alive():
                # Started here (not at import): a forked worker process has its own.
                self._thread = threading.Thread(
                    target=self._run, name="webhook-cutoffs", daemon=True
                )
                self._thread.start()
            if self._heap[0][2] is cutoff:
                self._changed.notify()
        self._local.current = cutoff
        try:
            yield cutoff
        finally:
            self._local.current = None
            cutoff.finish()

    def watch(self, connection: urllib3.connection.HTTPConnection) -> None:
        """``connection`` carries this thread's request now (a connection used outside
        ``armed`` is not watched)."""
        cutoff = getattr(self._local, "current", None)
        if cutoff is not None:
            cutoff.watch(connection)

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    while self._heap and self._heap[0][2].done:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._changed.wait()
                        continue
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        cutoff = heapq.heappop(self._heap)[2]
                        break
                    self._changed.wait(wait)
            cutoff.fire()


cutoffs = _Cutoffs()


class _Watched:
    """A pool's connection, handed to its thread's cut-off as it connects and as it sends."""

    def connect(self) -> None:
        cutoffs.watch(self)
        super().connect()

    def request(self, *args, **kwargs) -> None:
        cutoffs.watch(self)
        super().request(*args, **kwargs)


class _FinalAnswer(http.client.HTTPResponse):
    """The receiver's final answer, read past any informational ones (1xx) before it, as
    HTTP asks of every client. ``http.client`` reads past 100 Continue only: a 103 Early
    Hints or a 102 Processing would be taken for the answer (and the delivery failed for
    good on it). 101 stays an answer: the receiver left HTTP, which the hub never asks."""

    def _read_status(self):
        while True:
            version, status, reason = super()._read_status()
            if not 102 <= status < 200:
                return version, status, reason
            # Its headers are skipped (and bounded like any answer's); a receiver sending
            # such answers without end meets the request's time limit.
            http.client.parse_headers(self.fp)


class _WatchedHTTPConnection(_Watched, urllib3.connection.HTTPConnection):
    response_class = _FinalAnswer


class _WatchedHTTPSConnection(_Watched, urllib3.connection.HTTPSConnection):
    response_class = _FinalAnswer


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


pools = _Pools()


def _post_once(
    url: str, body: bytes, headers: dict[str, str], deadline: float, cutoff: _Cutoff
) -> tuple[int, str, str, float | None]:
    target = target_of(url)
    address = target.host if target.is_address else resolve(target.host, target.port, deadline)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("no time left for the request")
    timeout = urllib3.Timeout(
        connect=min(settings.WEBHOOK_CONNECT_TIMEOUT, remaining),
        read=min(settings.WEBHOOK_READ_TIMEOUT, remaining),
    )
    pool = pools.get(
        _PoolKey(
            scheme=target.scheme,
            address=address,
            port=target.port,
            server_name=target.host if target.scheme == "https" else "",
            ca_bundle=(settings.WEBHOOK_CA_BUNDLE or certifi.where())
            if target.scheme == "https"
            else "",
        )
    )
    for reuse in (True, False):
        made = pool.num_connections
        try:
            response = pool.urlopen(
                "POST",
                target.path,
                body=body,
                headers={**headers, "Host": target.authority},
                timeout=timeout,
                redirect=False,
                preload_content=False,
                assert_same_host=False,
            )
            break
        except ProtocolError:
            # A kept connection the receiver closed as it was reused (no answer came, and
            # none will on it): once more, on a new connection. Never after a timeout, and
            # never when the connection was new.
            if not reuse or pool.num_connections != made or time.monotonic() >= deadline:
                raise
    whole = False
    try:
        excerpt, whole = _read_bounded(response, deadline)
        if cutoff.fired:
            # Cut at the time limit: what was read may end anywhere.
            whole = False
            raise TimeoutError("cut off at the time limit")
        return (
            response.status,
            excerpt,
            response.headers.get("Location", ""),
            _retry_after(response.headers.get("Retry-After")),
        )
    finally:
        if not whole:
            # The rest is never read: the connection is closed, not kept.
            response.close()
        response.release_conn()


def _read_bounded(response, deadline: float) -> tuple[str, bool]:
    """At most WEBHOOK_MAX_RESPONSE_BYTES of the body, within the deadline, and whether
    that was the whole body (else the rest is left unread: the connection is closed, not
    drained, nor kept)."""
    limit = settings.WEBHOOK_MAX_RESPONSE_BYTES
    chunks, size, whole = [], 0, False
    while time.monotonic() < deadline:
        chunk = response.read(min(4096, limit - size) if size < limit else 1, decode_content=False)
        if not chunk:
            whole = True
            break
        if size >= limit:
            break  # more than the bound: not read further
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace"), whole


# Retry-After's delay-seconds: digits only (not float()'s "1e3", "inf", "1_000", "-5").
_DELAY_SECONDS = re.compile(r"[0-9]+")


def _retry_after(value: str | None) -> float | None:
    """The seconds a Retry-After asks to wait (its two forms: delay-seconds, or an
    HTTP-date counted from now); None when it is neither, or a time already past, and the
    schedule's own delay stands. How long a wait is honoured is the schedule's to bound."""
    value = (value or "").strip()
    if _DELAY_SECONDS.fullmatch(value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    # An HTTP-date is in GMT; one without a zone is read so too.
    seconds = when.replace(tzinfo=when.tzinfo or UTC).timestamp() - time.time()
    return seconds if seconds > 0 else None
