"""Login throttles: per client address and per email, counted in the Django cache (Redis).

The rates are settings (``LOGIN_RATE_PER_IP``, ``LOGIN_RATE_PER_EMAIL``) read at
each request, so an environment, or a test, can change them.
"""

from __future__ import annotations

import hashlib
import logging

import redis
from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

from common.accelerator import redis_hold_off
from identity.emails import normalize_email

logger = logging.getLogger("hubdommed.identity")


class _LoginThrottle(SimpleRateThrottle):
    setting: str = ""

    def __init__(self) -> None:
        # DRF reads the rate in __init__ from its own settings; ours come from Django's.
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)

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
            return super().allow_request(request, view)
        except (redis.RedisError, OSError) as exc:
            if hold_off.failed():
                logger.warning(
                    "login throttle %s skipped: the cache is unavailable (%s)", self.scope, exc
                )
            return True

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
