"""Query plumbing the modules' selectors share: the narrowing of a list by its filters."""

from __future__ import annotations

import operator
from functools import reduce
from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet

M = TypeVar("M", bound=Model)


def narrowed(queryset: QuerySet[M], **lookups: Any) -> QuerySet[M]:
    """``queryset`` filtered by each of ``lookups`` that has a value: ``None`` is no filter."""
    given = {lookup: value for lookup, value in lookups.items() if value is not None}
    return queryset.filter(**given) if given else queryset


def searched(
    queryset: QuerySet[M], search: str, fields: tuple[str, ...] = ("name", "slug", "description")
) -> QuerySet[M]:
    """The rows of ``queryset`` where one of ``fields`` contains ``search``, whatever its case;
    a blank search keeps them all."""
    if not search:
        return queryset
    return queryset.filter(reduce(operator.or_, (Q(**{f"{f}__icontains": search}) for f in fields)))
