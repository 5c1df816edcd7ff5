"""Reading settings from the environment with errors that name the variable.

django-environ parses the values; this wrapper turns a bad value into an
``ImproperlyConfigured`` that says which variable is wrong and why, so a
misconfigured service fails at start-up instead of at its first request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured


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

    def str(self, var: str, default: Any = environ.Env.NOTSET) -> str:
        return self._read("str", var, default)

    def bool(self, var: str, default: Any = environ.Env.NOTSET) -> bool:
        raw = self._env.str(var, default="").strip().lower()
        if raw and raw not in _BOOLEAN_WORDS:
            raise ImproperlyConfigured(
                f"{var}={raw!r} is not a boolean: use one of {', '.join(sorted(_BOOLEAN_WORDS))}"
            )
        return self._read("bool", var, default)

    def int(
        self, var: str, default: Any = environ.Env.NOTSET, *, minimum: int | None = None
    ) -> int:
        return self._number("int", var, default, minimum)

    def float(
        self, var: str, default: Any = environ.Env.NOTSET, *, minimum: float | None = None
    ) -> float:
        return self._number("float", var, default, minimum)

    def _number(self, kind: str, var: str, default: Any, minimum: Any) -> Any:
        value = self._read(kind, var, default)
        if minimum is not None and value < minimum:
            raise ImproperlyConfigured(f"{var}={value} must be at least {minimum}")
        return value

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
