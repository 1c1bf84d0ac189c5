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
    quote = db.ops.quote_name
    arrays = ", ".join(f"%b::{_db_type(f, db)}[]" for f in fields)  # binary: no escaping
    sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
           f"SELECT * FROM UNNEST({arrays})")
    if suffix:
        sql += " " + suffix
    if returning:
        sql += " RETURNING " + ", ".join(quote(meta.get_field(name).column) for name in returning)
    params = [[_value(f, obj, db) for obj in objs] for f in fields]
    db.ensure_connection()
    from psycopg import Cursor  # PostgreSQL only: server-side binding

    with db._prepare_cursor(Cursor(db.connection)) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if returning else []


def _db_type(field: models.Field, db) -> str:
    target = field.target_field if field.is_relation else field
    return target.db_type(db).split("(")[0]  # varchar[], not varchar(64)[]


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
