"""Large card columns compressed with lz4 instead of PostgreSQL's default pglz.

PostgreSQL compresses a row's large values (TOAST) when the row passes ~2 KiB, which a
registration's 2-8 KiB card does in several columns (the card as JSON and as sent in the agent
row, as sent in its card version, and the search document's entry). With pglz that compression
was a fifth of PostgreSQL's CPU per registration; lz4 does it at a fraction of the cost, for a
slightly larger result (measured with ``EXPLAIN``-free SQL timings: pglz ~70-100 µs per 5 KiB
value, lz4 ~10 µs). Needs PostgreSQL 14+ built with lz4 (Debian's and the official images are);
elsewhere -- SQLite, an older server -- the migration does nothing and the default stays.
Values written before keep their compression; both read alike.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def lz4_available(connection: Any) -> bool:
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'")
        row = cursor.fetchone()
    return row is not None and "lz4" in (row[0] or [])


def compress_with_lz4(*columns: tuple[str, str]) -> migrations.RunPython:
    """A migration operation setting ``(table, column)`` pairs to lz4 compression (undone by
    setting them back to the server's default)."""

    def alter(schema_editor: Any, method: str) -> None:
        connection = schema_editor.connection
        if not lz4_available(connection):
            return
        quote = connection.ops.quote_name
        for table, column in columns:
            schema_editor.execute(
                f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column)} SET COMPRESSION {method}")

    return migrations.RunPython(lambda apps, editor: alter(editor, "lz4"),
                                lambda apps, editor: alter(editor, "default"))
