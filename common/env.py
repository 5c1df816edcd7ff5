"""Reading settings from the environment with errors that name the variable.

django-environ parses the values; this wrapper turns a bad value into an
``ImproperlyConfigured`` that says which variable is wrong and why, so a
misconfigured service fails at start-up instead of at its first request.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

from lifecycle.values import parse_number


class Env:
    def __init__(self) -> None:
        self._env = environ.Env()

    def _read(self, kind: str, var: str, default: Any, **kwargs: Any) -> Any:
        reader: Callable[..., Any] = getattr(self._env, kind)
        try:
            return reader(var, default=default, **kwargs)
        except ImproperlyConfigured:
            raise
        except Exception as exc:
            raw = self._env.str(var, default="")
            raise ImproperlyConfigured(f"{var}={raw!r} is not a valid {kind}: {exc}") from exc

    def str(self, var: str, default: Any = environ.Env.NOTSET, *, blank: bool = True) -> str:
        """``blank=False``: a name or a place that empty would silently change (an empty
        METRICS_HOST listens on every interface, an empty exchange is RabbitMQ's default)."""
        value = self._read("str", var, default)
        if not blank and not value.strip():
            raise ImproperlyConfigured(f"{var}={value!r} is empty: leave it unset or give a value")
        return value

    def bool(self, var: str, default: Any = environ.Env.NOTSET) -> bool:
        # Set but empty is refused too: read as false, it would turn a secure default
        # (SESSION_COOKIE_SECURE, say) off without a word.
        if var in os.environ:
            raw = os.environ[var].strip().lower()
            if raw not in _BOOLEAN_WORDS:
                raise ImproperlyConfigured(
                    f"{var}={os.environ[var]!r} is not a boolean: use one of "
                    f"{', '.join(sorted(_BOOLEAN_WORDS))}"
                )
        return self._read("bool", var, default)

    def int(
        self,
        var: str,
        default: Any = environ.Env.NOTSET,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int:
        return self._number(var, default, whole=True, minimum=minimum, maximum=maximum)

    def float(
        self,
        var: str,
        default: Any = environ.Env.NOTSET,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float:
        return self._number(var, default, whole=False, minimum=minimum, maximum=maximum)

    def _number(self, var: str, default: Any, *, whole: bool, minimum: Any, maximum: Any) -> Any:
        """The variable read strictly (``lifecycle.values``): ``5s`` or ``1e3s`` is refused,
        never read as 5 or 13 as django-environ would; unset, the default."""
        if var not in os.environ:
            if default is environ.Env.NOTSET:
                raise ImproperlyConfigured(f"{var} must be set")
            return default
        try:
            return parse_number(os.environ[var], whole=whole, minimum=minimum, maximum=maximum)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{var}={os.environ[var]!r} is not {exc}") from None

    def choice(self, var: str, choices: Sequence[str], default: str) -> str:
        value = self.str(var, default).strip().lower()
        if value not in choices:
            raise ImproperlyConfigured(f"{var}={value!r} must be one of: {', '.join(choices)}")
        return value

    def list(self, var: str, default: Any = environ.Env.NOTSET) -> list[str]:
        return [item.strip() for item in self._read("list", var, default) if item.strip()]

    def url(self, var: str, default: str, *, schemes: Sequence[str]) -> str:
        value = self.str(var, default)
        _check_scheme(var, value, schemes)
        return value

    def urls(self, var: str, default: str, *, schemes: Sequence[str]) -> str:
        """One URL or several, comma-separated (each checked); the value as given."""
        value = self.str(var, default)
        parts = [part.strip() for part in value.split(",")]
        if not all(parts):
            raise ImproperlyConfigured(f"{var}={value!r} has an empty URL in its list")
        for part in parts:
            _check_scheme(var, part, schemes)
        return ",".join(parts)

    def db(self, var: str, default: str) -> dict[str, Any]:
        self.url(var, default, schemes=("postgres", "postgresql", "pgsql"))
        return self._read("db_url", var, default)


_BOOLEAN_WORDS = {"true", "false", "1", "0", "yes", "no", "on", "off", "y", "n", "t", "f"}


def _check_scheme(var: str, value: str, schemes: Sequence[str]) -> None:
    scheme = value.split("://", 1)[0] if "://" in value else ""
    if scheme not in schemes:
        raise ImproperlyConfigured(
            f"{var}={value!r} is not a valid URL: expected a scheme among {', '.join(schemes)}"
        )


def settings_or_exit() -> None:
    """Read the settings now. A bad variable ends the process with one line that names it
    and says what it accepts (exit 1), not a traceback from wherever the settings happened
    to be first read (under a Django command, one that starts with a ``KeyError``)."""
    from django.conf import settings

    try:
        settings.INSTALLED_APPS  # noqa: B018 (reading it loads every setting)
    except ImproperlyConfigured as exc:
        sys.stderr.write(f"cannot start: {exc}\n")
        sys.stderr.flush()
        raise SystemExit(1) from None
