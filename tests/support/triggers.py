"""Guard triggers dropped for one test, as someone with database access can drop them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import text


@contextmanager
def dropped_trigger(db, name: str, table: str, *, sqlite_names: tuple[str, ...] = ()
                    ) -> Iterator[None]:
    """Without PostgreSQL's trigger ``name`` on ``table`` (SQLite's ``sqlite_names``, by
    default the same name) for the block; restored afterwards on PostgreSQL, whose database
    the test session shares (a SQLite test has its file to itself)."""
    with db.engine.begin() as conn:
        if db.is_postgres:
            definition = conn.execute(text(
                "SELECT pg_get_triggerdef(oid) FROM pg_trigger "
                "WHERE tgname = :name AND tgrelid = CAST(:table AS regclass)"
            ), {"name": name, "table": table}).scalar_one()
            conn.exec_driver_sql(f"DROP TRIGGER {name} ON {table}")
        else:
            for sqlite_name in sqlite_names or (name,):
                conn.exec_driver_sql(f"DROP TRIGGER {sqlite_name}")
    yield
    if db.is_postgres:
        with db.engine.begin() as conn:
            conn.exec_driver_sql(definition)
