"""The primary's connection pool on PostgreSQL: a connection is pinged only after it idled, and a
dead one found that way is replaced before the caller sees it."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import event, text

from agentledger.core import database

pytestmark = pytest.mark.pg_only


def _backend_pid(db) -> int:
    with db.engine.connect() as connection:
        return connection.execute(text("SELECT pg_backend_pid()")).scalar_one()


def _terminate(url: str, pid: int) -> None:
    libpq = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _statements(db) -> list[str]:
    seen: list[str] = []
    event.listen(db.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: seen.append(statement))
    return seen


def test_a_connection_used_a_moment_ago_is_not_pinged(pg_db, monkeypatch):
    first = _backend_pid(pg_db)
    pinged = []
    original = pg_db.engine.dialect.do_ping
    monkeypatch.setattr(pg_db.engine.dialect, "do_ping",
                        lambda conn: pinged.append(1) or original(conn))
    assert _backend_pid(pg_db) == first  # the same pooled connection, reused
    assert pinged == []


def test_a_dead_connection_that_idled_is_replaced_before_use(pg_db, pg_url):
    # As if it had idled past the threshold (rather than waiting that long).
    pid = _backend_pid(pg_db)
    _terminate(pg_url, pid)
    pool = pg_db.engine.pool
    for record in list(pool._pool.queue):  # the idle connections  # noqa: SLF001
        record.info["idle_since"] = time.monotonic() - database.PING_AFTER_IDLE_SECONDS - 1
    seen = _statements(pg_db)
    with pg_db.write() as session:  # no error reaches the caller
        fresh = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
    assert fresh != pid
    assert seen[-1] == "SELECT pg_backend_pid()"


def test_a_dead_connection_used_a_moment_ago_fails_once_then_the_pool_recovers(
        pg_db, pg_url):
    pid = _backend_pid(pg_db)
    _terminate(pg_url, pid)
    with pytest.raises(Exception) as failed:  # noqa: B017, PT011 - the driver's own error
        with pg_db.write() as session:
            session.execute(text("SELECT 1"))
    assert "terminat" in str(failed.value).lower() or "closed" in str(failed.value).lower()
    assert _backend_pid(pg_db) != pid  # the next checkout has a new connection
