"""Many rows of one model written by one INSERT whose values travel one parameter a column.

``bulk_create`` builds a model instance per row and a parameter per value, which the
compiler and the driver then prepare value by value: for a batch of a thousand rows, most of
its time. ``insert_sql`` takes the rows as columns instead: each column one array
(``unnest``), a JSON column one JSON document (``jsonb_array_elements``: the driver would
otherwise quote every element of a ``jsonb[]`` on its own), a value the same in every row
one parameter, and the columns nobody gave their defaults, computed once for the statement.
The database zips the columns back into rows (``ROWS FROM``), in order.

The values are the ones the driver takes as they are (ints, strings, UUIDs, aware datetimes,
booleans, None); nothing is converted per value, which is the point. A JSON column's values
are Python objects, dumped together with the field's encoder, or a ``JSONArray`` already
dumped (an element ``null`` is SQL NULL, as ``None`` is for the ORM).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, models
from django.db.models.expressions import DatabaseDefault
from django.db.models.sql import InsertQuery


@dataclass(frozen=True)
class JSONArray:
    """A JSON column's values as one JSON array (text), an element a row."""

    text: str
    rows: int

    @classmethod
    def of_texts(cls, texts: Sequence[str]) -> JSONArray:
        """Values already dumped, each a JSON text: joined, not dumped again."""
        return cls("[" + ",".join(texts) + "]", len(texts))


def insert_sql(
    model: type[models.Model],
    columns: Mapping[str, Sequence[Any] | JSONArray],
    *,
    same: Mapping[str, Any] | None = None,
    overriding: bool = False,
) -> tuple[str, list[Any]]:
    """The INSERT of the rows given as ``columns`` (field name: one value a row) and ``same``
    (field name: one value, or an expression such as ``clock_timestamp()``, for every row),
    as SQL and parameters; ``overriding`` writes ids into an identity column.

    Every other field gets what ``bulk_create`` would give a row that left it alone, computed
    once: its default (a callable's one value for every row), ``auto_now``'s time, or the
    database's default. A unique field is never left to that: it is given per row.
    """
    meta = model._meta
    same = same or {}
    counts = {v.rows if isinstance(v, JSONArray) else len(v) for v in columns.values()}
    if len(counts) != 1 or counts == {0}:
        raise ValueError(f"the columns of {meta.label} need one length of one row or more")
    given = {meta.get_field(name): values for name, values in columns.items()}
    # A column the same in every row (a task's name, a queue) is one parameter, not an
    # array the driver would quote element by element; one column at least stays an array
    # or a document, which gives the rows.
    uniform = {
        field
        for field, values in given.items()
        if not isinstance(field, models.JSONField)
        and len(values) > 1
        and values.count(values[0]) == len(values)
    }
    if uniform == set(given):
        uniform.discard(next(iter(given)))
    compiler = InsertQuery(model).get_compiler(connection=connection)
    alike = {meta.get_field(name): value for name, value in same.items()}
    prototype = model(**{field.attname: value for field, value in alike.items()})
    names, selected, select_params, sources, source_params = [], [], [], [], []
    for field in meta.concrete_fields:
        if field.generated:
            continue
        if field in given:
            values = given[field]
            alias = f"c{len(sources)}"
            if field in uniform:
                selected.append(f"%s::{field.db_type(connection)}")
                select_params.append(values[0])
            elif isinstance(field, models.JSONField):
                if not isinstance(values, JSONArray):
                    values = JSONArray(json.dumps(list(values), cls=field.encoder), len(values))
                sources.append("jsonb_array_elements(%s::jsonb)")
                source_params.append(values.text)
                # A JSON null element is the SQL NULL the ORM writes for None.
                selected.append(f"NULLIF(u.{alias}, 'null'::jsonb)")
            else:
                sources.append(f"unnest(%s::{field.db_type(connection)}[])")
                source_params.append(list(values))
                selected.append(f"u.{alias}")
            names.append(field.column)
            continue
        if field is meta.auto_field and field not in alike:
            continue
        if field not in alike and (field.unique or field.primary_key):
            raise ValueError(f"{meta.label}.{field.name} is unique: give it for every row")
        value = field.pre_save(prototype, add=True)
        if isinstance(value, DatabaseDefault) or value is None:
            continue  # the database's default, or NULL (Django gives its columns no other)
        if hasattr(value, "resolve_expression"):
            resolved = value.resolve_expression(compiler.query, allow_joins=False, for_save=True)
            sql, params = compiler.compile(resolved)
            selected.append(sql)
            select_params.extend(params)
        else:
            selected.append(f"%s::{field.db_type(connection)}")
            select_params.append(field.get_db_prep_save(value, connection))
        names.append(field.column)
    quote = connection.ops.quote_name
    aliases = ", ".join(f"c{n}" for n in range(len(sources)))
    override = " OVERRIDING SYSTEM VALUE" if overriding else ""
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(name) for name in names)})"  # noqa: S608 (names, types and expressions of the model; every value a parameter)
        f"{override} SELECT {', '.join(selected)} "
        f"FROM ROWS FROM ({', '.join(sources)}) AS u({aliases})"
    )
    return sql, select_params + source_params
