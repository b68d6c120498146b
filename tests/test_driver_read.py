"""The principal look-up through psycopg directly (``core.driver_read``): the same answers as
through SQLAlchemy, only for statements SQLAlchemy has nothing to convert in, on a pooled
connection that is left as the pool expects it, and failures that look like SQLAlchemy's."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import bindparam, select, text
from sqlalchemy.exc import DBAPIError

from agentledger.core.driver_read import DriverRead
from agentledger.core.schema import AgentRun, ApiToken
from ingest.tokens import create_token, revoke_token
from queries.principals import _BY_HASH, principal_from_row, principal_lookup

pytestmark = pytest.mark.pg_only


def _backend_pid(db) -> int:
    """The backend of the pooled connection the primary's reads use next."""
    with db.primary_read_engine.connect() as connection:
        return connection.execute(text("SELECT pg_backend_pid()")).scalar_one()


def test_the_principal_lookup_takes_the_driver_path_and_answers_as_before(pg_db):
    from agentledger.core.hashing import token_hash

    assert DriverRead.of(_BY_HASH, pg_db.primary_read_engine) is not None
    with pg_db.write() as s:
        token_id, secret = create_token(s, owner_id="alice", role="executor")
    statement, params = principal_lookup(token_hash=token_hash(secret))
    found = principal_from_row(pg_db.read_row(statement, params))
    assert (found.token_id, found.owner_id, found.role) == (token_id, "alice", "executor")
    with pg_db.read() as s:
        expected = s.execute(statement, params).one()
    assert tuple(pg_db.read_row(statement, params)) == tuple(expected)

    with pg_db.write() as s:
        revoke_token(s, token_id)
    # Revocation takes effect on the next request: nothing is cached but the compiled SQL.
    assert pg_db.read_row(statement, params) is None
    assert pg_db.read_row(*principal_lookup(token_hash="0" * 64)) is None


def test_a_statement_that_needs_conversion_is_left_to_sqlalchemy(pg_db):
    engine = pg_db.primary_read_engine
    # UTCDateTime converts results, and binds: SQLAlchemy runs such a statement.
    times = select(AgentRun.created_at).where(AgentRun.id == bindparam("run_id"))
    assert DriverRead.of(times, engine) is None
    since = select(ApiToken.id).where(ApiToken.created_at >= bindparam("since"))
    assert DriverRead.of(since, engine) is None
    assert DriverRead.of(text("SELECT 1"), engine) is None  # no typed result columns


def test_the_pooled_connection_goes_back_out_of_autocommit_and_idle(pg_db):
    pid = _backend_pid(pg_db)
    assert pg_db.read_row(*principal_lookup(token_hash="0" * 64)) is None
    fairy = pg_db.primary_read_engine.raw_connection()
    try:
        driver = fairy.driver_connection
        assert driver.autocommit is False
        assert driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        fairy.close()
    with pg_db.read() as s:  # a read transaction on the same pooled connection
        assert s.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
        driver = s.connection().connection.driver_connection
        assert driver.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS


def test_a_connection_killed_under_the_read_fails_as_dbapi_error_and_is_replaced(
        pg_db, pg_url):
    pid = _backend_pid(pg_db)
    libpq = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(DBAPIError) as failed:
        pg_db.read_row(*principal_lookup(token_hash="0" * 64))
    assert failed.value.connection_invalidated
    assert pg_db.read_row(*principal_lookup(token_hash="0" * 64)) is None
    assert _backend_pid(pg_db) != pid
