"""Multi-row INSERTs of registrations' rows, cheap on the node's CPU.

Django 5.2 writes a multi-row insert on PostgreSQL as ``INSERT ... SELECT * FROM UNNEST(%s::
text[], ...)``, one array parameter per column -- but binds it client-side (Django's default
with psycopg 3), where psycopg quotes the arrays in Python, escaping every character of every
element with a regular expression: for registrations' 2-8 KiB cards ~3 ms per row, more than
the rest of a registration (cProfile of a batch). Here the same statement is bound server-side
(the arrays go out in psycopg's C dumpers, the statement text stays short), and JSON values are
encoded with orjson. Elsewhere (SQLite) Django's own ``bulk_create`` statement is used.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson
from django.db import DEFAULT_DB_ALIAS, connections, models


def insert_rows(model: type[models.Model], objs: Sequence[models.Model], *, suffix: str = "",
                returning: Sequence[str] = ()) -> list[tuple]:
    """INSERT ``objs`` (every concrete field but the key) in one statement; ``suffix`` is
    appended (an ``ON CONFLICT`` clause); the ``returning`` columns of the rows written.
    PostgreSQL only."""
    db = connections[DEFAULT_DB_ALIAS]  # not the per-attribute proxy: one lookup per value
    meta = model._meta
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    rows, params = unnest(fields, objs)
    quote = db.ops.quote_name
    sql = f"{insert_into(model, fields)} SELECT * FROM {rows}"
    if suffix:
        sql += " " + suffix
    if returning:
        sql += " RETURNING " + ", ".join(quote(meta.get_field(name).column) for name in returning)  # type: ignore[union-attr, arg-type]  # concrete fields
    return execute(sql, params, fetch=bool(returning))


def insert_into(model: type[models.Model], fields: Sequence[models.Field]) -> str:
    """``INSERT INTO table (columns)`` of ``fields``."""
    quote = connections[DEFAULT_DB_ALIAS].ops.quote_name
    return (f"INSERT INTO {quote(model._meta.db_table)} "
            f"({', '.join(quote(f.column) for f in fields)})")  # type: ignore[arg-type]  # concrete fields


def unnest(fields: Sequence[models.Field], objs: Sequence[models.Model],
           first: Sequence[str] | None = None) -> tuple[str, list]:
    """``UNNEST(...)`` of ``fields``' values of ``objs`` (one binary array parameter per
    column) and its parameters; ``first``: a text column put before them."""
    db = connections[DEFAULT_DB_ALIAS]
    arrays = ", ".join(f"%b::{_db_type(f, db)}[]" for f in fields)
    params = []
    for f in fields:
        plain = _plain_attname(f)
        params.append([getattr(obj, plain) for obj in objs] if plain is not None
                      else [_value(f, obj, db) for obj in objs])
    if first is not None:
        arrays, params = "%b::text[], " + arrays, [list(first), *params]
    return f"UNNEST({arrays})", params


def execute(sql: str, params: list, *, fetch: bool = False) -> list[tuple]:
    """Run ``sql`` bound server-side (binary parameters); its rows when ``fetch``."""
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    from psycopg import Cursor  # PostgreSQL only: server-side binding

    with db._prepare_cursor(Cursor(db.connection)) as cursor:  # type: ignore[attr-defined]  # private Django API
        cursor.execute(sql, params)
        return cursor.fetchall() if fetch else []


def _db_type(field: models.Field, db) -> str:
    target = field.target_field if field.is_relation else field  # type: ignore[attr-defined]  # relations have one
    return target.db_type(db).split("(")[0]  # type: ignore[union-attr]  # varchar[], not varchar(64)[]; concrete fields have a type


# Field classes whose database value is the attribute itself (pre_save and get_db_prep_save
# return valid values unchanged): read as they are, a bulk insert's main cost on the node.
_PLAIN_TYPES = frozenset({
    models.CharField, models.TextField, models.URLField, models.SlugField, models.BooleanField,
    models.IntegerField, models.BigIntegerField, models.SmallIntegerField,
    models.PositiveIntegerField, models.PositiveSmallIntegerField, models.PositiveBigIntegerField,
})


def _plain_attname(field: models.Field) -> str | None:
    """The attribute to read as it is for ``field`` (None: convert it as Django would)."""
    if type(field) in _PLAIN_TYPES:
        return field.attname
    if isinstance(field, models.ForeignKey) and type(field.target_field) in (
            models.AutoField, models.BigAutoField, models.CharField, *_PLAIN_TYPES):
        return field.attname  # the key's value (or None)
    return None


def _value(field: models.Field, obj: models.Model, db) -> Any:
    value = field.pre_save(obj, True)
    if isinstance(field, models.JSONField) and field.encoder is None and value is not None:
        from psycopg.types.json import Jsonb

        return Jsonb(value, dumps=_dumps)
    return field.get_db_prep_save(value, db)


def _dumps(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # what orjson refuses (an integer past 64 bits) json still writes
        return json.dumps(value)
