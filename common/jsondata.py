"""Checks on JSON values that PostgreSQL would refuse only at the INSERT (as a 500)."""

from __future__ import annotations

from typing import Any

NUL = "\x00"


def contains_nul(value: Any) -> bool:
    """Whether any string or key in ``value`` holds U+0000, which ``jsonb`` cannot store."""
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, str):
            if NUL in current:
                return True
        elif isinstance(current, dict):
            stack.extend(current.keys())
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return False
