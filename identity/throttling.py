"""Login throttles: per client address and per email, counted in the Django cache (Redis).

The rates are settings (``LOGIN_RATE_PER_IP``, ``LOGIN_RATE_PER_EMAIL``) read at
each request, so an environment, or a test, can change them.

A limit of N per period is a sliding window: an attempt passes when fewer than N attempts
passed in the period before it; a refused one is not counted, and is told to retry when the
oldest of those N leaves the window. The check and the count are one Lua script in Redis,
so concurrent attempts, in any number of processes, never get more than N through: each
one sees the count the ones before it left (DRF's ``SimpleRateThrottle`` reads the count,
then writes it back, and concurrent attempts all read the same one).
"""

from __future__ import annotations

import hashlib
import logging
import uuid

import redis
from django.conf import settings
from django.core.cache import cache
from rest_framework.throttling import SimpleRateThrottle

from common.accelerator import redis_hold_off
from identity.emails import normalize_email

logger = logging.getLogger("hubdommed.identity")

# KEYS[1]: a sorted set of the attempts that passed, scored by their time in ms (Redis's
# clock: one for every API process). ARGV: the window in ms, the limit, a unique member.
# Returns 0 when the attempt passes (and is counted), else the ms until one may.
_CHECK_AND_COUNT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], window)
  return 0
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if oldest[2] == nil then
  return window
end
return math.max(1, tonumber(oldest[2]) + window - now)
"""


class _LoginThrottle(SimpleRateThrottle):
    setting: str = ""
    # Not the keys DRF's throttle wrote (pickled lists): the script would fail on those
    # (WRONGTYPE) until they expire, and each failure would hold Redis off.
    cache_format = "login-throttle:%(scope)s:%(ident)s"

    def __init__(self) -> None:
        # DRF reads the rate in __init__ from its own settings; ours come from Django's.
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self.retry_after: float | None = None

    def get_rate(self) -> str:
        return getattr(settings, self.setting)

    def allow_request(self, request, view) -> bool:
        # Redis is an accelerator: with it down the counters are lost for a while (the
        # password hasher's cost still slows guessing), but nobody is locked out by a 500.
        # A Redis that hangs is held off like one that is down (common.accelerator): a login
        # pays its timeout once per outage, not on every attempt.
        hold_off = redis_hold_off(settings.CACHES["default"]["LOCATION"])
        if not hold_off.admits():
            return True
        try:
            return self._check_and_count(request, view)
        except (redis.RedisError, OSError) as exc:
            if hold_off.failed():
                logger.warning(
                    "login throttle %s skipped: the cache is unavailable (%s)", self.scope, exc
                )
            return True

    def _check_and_count(self, request, view) -> bool:
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        key = cache.make_and_validate_key(key)  # the cache's KEY_PREFIX and version
        # The cache's own Redis client (Django's RedisCache has no public accessor): its
        # pool, location and timeouts, which a test's settings change like the cache's.
        client = cache._cache.get_client(key, write=True)
        wait_ms = client.register_script(_CHECK_AND_COUNT)(
            keys=[key], args=[int(self.duration * 1000), self.num_requests, uuid.uuid4().hex]
        )
        if int(wait_ms) <= 0:
            return True
        self.retry_after = int(wait_ms) / 1000
        return False

    def wait(self) -> float | None:
        """Seconds until an attempt may pass again (after a refusal)."""
        return self.retry_after

    def get_ident(self, request) -> str:
        """The client address: ``REMOTE_ADDR``, or the address that many trusted proxies saw.

        ``X-Forwarded-For`` is trusted only as far as ``TRUSTED_PROXY_COUNT`` says,
        otherwise anyone could dodge the per-address limit by sending the header.
        """
        proxies = settings.TRUSTED_PROXY_COUNT
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        if proxies and forwarded:
            addresses = [part.strip() for part in forwarded.split(",") if part.strip()]
            if addresses:
                return addresses[-min(proxies, len(addresses))]
        return request.META.get("REMOTE_ADDR", "")


class LoginRateByAddress(_LoginThrottle):
    scope = "login_ip"
    setting = "LOGIN_RATE_PER_IP"

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class LoginRateByEmail(_LoginThrottle):
    scope = "login_email"
    setting = "LOGIN_RATE_PER_EMAIL"

    def get_cache_key(self, request, view) -> str | None:
        email = request.data.get("email") if hasattr(request.data, "get") else None
        if not isinstance(email, str) or not email.strip():
            return None  # nothing to count; the serializer refuses the request
        # The normal form login looks the user up by, so every spelling that reaches one
        # account counts against one limit. Hashed: emails are not cached in clear.
        ident = hashlib.sha256(normalize_email(email).encode("utf-8", "replace")).hexdigest()
        return self.cache_format % {"scope": self.scope, "ident": ident}
