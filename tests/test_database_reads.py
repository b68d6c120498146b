"""Reads on PostgreSQL's primary run outside a transaction: no BEGIN and COMMIT round trips, still
refused any write, and the reads that need a transaction (a server-side cursor) ask for one."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError

from queries.chain_verification import verify_chains
from queries.common import _without_parallel_workers
from queries.runs import RunFilters, list_runs

pytestmark = pytest.mark.pg_only

IDLE, INTRANS = psycopg.pq.TransactionStatus.IDLE, psycopg.pq.TransactionStatus.INTRANS


def _status(session) -> psycopg.pq.TransactionStatus:
    return session.connection().connection.dbapi_connection.info.transaction_status


def _statements(engine) -> list[str]:
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: seen.append(statement))
    return seen


def test_a_read_runs_outside_a_transaction_and_still_refuses_writes(pg_db):
    with pg_db.read() as session:
        assert session.execute(text("SELECT 1")).scalar_one() == 1
        assert _status(session) == IDLE
        with pytest.raises(DBAPIError, match="read-only transaction"):
            session.execute(text("CREATE TABLE read_may_not_write (a int)"))
        # A failed statement leaves nothing to roll back: the next one runs.
        assert session.execute(text("SELECT 2")).scalar_one() == 2


def test_a_read_asked_for_a_transaction_gets_one(pg_db):
    with pg_db.read(transaction=True) as session:
        session.execute(text("SELECT 1"))
        assert _status(session) == INTRANS
        with pytest.raises(DBAPIError, match="read-only transaction"):
            session.execute(text("CREATE TABLE read_may_not_write (a int)"))


def test_the_connection_goes_back_to_the_pool_in_a_transaction_mode(pg_db):
    """Writes share the pool's connections: one that served a read must not stay in autocommit."""
    with pg_db.read() as session:
        raw = session.connection().connection.dbapi_connection
        assert raw.autocommit
    assert not raw.autocommit


def test_a_page_is_read_without_parallel_workers_and_the_setting_given_back(pg_db):
    with pg_db.read() as session:
        default = session.execute(text("SHOW max_parallel_workers_per_gather")).scalar_one()
    seen = _statements(pg_db.primary_read_engine)
    with pg_db.read() as session:
        list_runs(session, RunFilters(status="succeeded"), limit=5)
        after = session.execute(text("SHOW max_parallel_workers_per_gather")).scalar_one()
    assert after == default
    page = next(i for i, s in enumerate(seen) if "FROM agent_run" in s)
    assert seen[page - 1] == "SET max_parallel_workers_per_gather = 0"
    assert seen[page + 1] == "RESET max_parallel_workers_per_gather"


def test_a_failing_page_still_gives_the_setting_back(pg_db):
    with pg_db.read() as session:
        default = session.execute(text("SHOW max_parallel_workers_per_gather")).scalar_one()
        with pytest.raises(DBAPIError, match="division by zero"):
            _without_parallel_workers(session, text("SELECT 1 / 0"), False)
        assert session.execute(text("SHOW max_parallel_workers_per_gather")).scalar_one() == default


def test_a_page_in_a_transaction_sets_the_workers_for_the_page_alone(pg_db):
    seen = _statements(pg_db.primary_read_engine)
    with pg_db.read(transaction=True) as session:
        list_runs(session, RunFilters(status="succeeded"), limit=5)
    assert "SET LOCAL max_parallel_workers_per_gather = 0" in seen


def test_checking_every_chain_needs_a_transaction_and_says_so(pg_db):
    with pg_db.read() as session, pytest.raises(ValueError, match="transaction=True"):
        verify_chains(session)
    with pg_db.read() as session:  # one run's events need no cursor
        assert verify_chains(session, run_id="run_missing").runs_checked == 0
    with pg_db.read(transaction=True) as session:
        assert verify_chains(session).ok
