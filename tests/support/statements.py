"""The SQL statements a block of code sends to the database, whichever way it sends them.

SQLAlchemy's cursor events miss the statements ``core.driver_statements`` sends on psycopg's
connection directly, so on PostgreSQL the statements are recorded at psycopg's cursor, which
both ways go through (the database is still the real one; the spy only records)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import event


@contextmanager
def statements_sent(db, before: Callable[[str], None] | None = None,
                    states: list[tuple[bool, str]] | None = None,
                    failed: list[tuple[str, str | None]] | None = None) -> Iterator[list[str]]:
    """The SQL text of every statement ``db``'s connections execute inside the block.
    ``before(sql)`` (PostgreSQL) runs just before each one is sent: a test can make another
    writer act between two statements of the code under test. ``states`` (PostgreSQL) gets,
    for each statement, its connection's autocommit and transaction status (``IDLE`` when no
    transaction is open) as it is sent. ``failed`` (PostgreSQL) gets each statement the server
    refused, with its SQLSTATE, even when the code under test caught the error (the server
    logged it all the same)."""
    sent: list[str] = []
    if db.is_postgres:
        execute = psycopg.Cursor.execute

        def recording(cursor, query, *args, **kwargs):
            text = (query if isinstance(query, str) else query.decode()
                    if isinstance(query, bytes) else str(query))
            sent.append(text)
            if states is not None:
                conn = cursor.connection
                states.append((conn.autocommit, conn.info.transaction_status.name))
            if before is not None:
                before(text)
            try:
                return execute(cursor, query, *args, **kwargs)
            except psycopg.Error as exc:
                if failed is not None:
                    failed.append((text, exc.sqlstate))
                raise

        psycopg.Cursor.execute = recording  # type: ignore[method-assign]
        try:
            yield sent
        finally:
            psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        return

    def seen(conn, cursor, statement, *rest):
        sent.append(statement)

    event.listen(db.engine, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
