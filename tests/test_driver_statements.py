"""Hot statements through psycopg directly (``core.driver_statements``): the same answers as
through SQLAlchemy, with parameters converted as SQLAlchemy converts them, on a pooled
connection that is left as the pool expects it, and failures that look like SQLAlchemy's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from sqlalchemy import bindparam, select, text
from sqlalchemy.exc import DBAPIError, NoResultFound
from support.factories import make_agent, make_session, post

from agentledger.core.database import read_all, read_one
from agentledger.core.driver_statements import DriverRead, DriverWrite
from agentledger.core.schema import AgentRun, ApiToken
from ingest.tokens import create_token, revoke_token
from queries.principals import _BY_HASH, principal_from_row, principal_lookup
from queries.run_states import run_states_read

pytestmark = pytest.mark.pg_only


def _backend_pid(db) -> int:
    """The backend of the pooled connection the primary's reads use next."""
    with db.primary_read_engine.connect() as connection:
        return connection.execute(text("SELECT pg_backend_pid()")).scalar_one()


def test_the_principal_lookup_takes_the_driver_path_and_answers_as_before(pg_db):
    from agentledger.core.hashing import token_hash

    with pg_db.write() as s:
        token_id, secret = create_token(s, owner_id="alice", role="executor")
    statement, params = principal_lookup(token_hash=token_hash(secret))
    found = principal_from_row(pg_db.read_row(statement, params))
    # once the engine has connected (the first read did) the look-up takes the driver path
    assert DriverRead.of(_BY_HASH, pg_db.primary_read_engine) is not None
    assert (found.token_id, found.owner_id, found.role) == (token_id, "alice", "executor")
    with pg_db.read() as s:
        expected = s.execute(statement, params).one()
    assert tuple(pg_db.read_row(statement, params)) == tuple(expected)

    with pg_db.write() as s:
        revoke_token(s, token_id)
    # Revocation takes effect on the next request: nothing is cached but the compiled SQL.
    assert pg_db.read_row(statement, params) is None
    assert pg_db.read_row(*principal_lookup(token_hash="0" * 64)) is None


def test_a_reads_parameters_are_converted_as_sqlalchemy_converts_them(pg_db):
    """A parameter with a bind processor (a ``UTCDateTime``, an array) reaches the driver as
    SQLAlchemy's execution would send it."""
    with pg_db.write() as s:
        token_id, _ = create_token(s, owner_id="alice", role="viewer")
    _backend_pid(pg_db)  # the engine has connected: the driver path is open
    engine = pg_db.primary_read_engine
    assert DriverRead.of(text("SELECT 1"), engine) is None  # no typed result columns
    since = select(ApiToken.id).where(ApiToken.created_at >= bindparam("since"))  # UTCDateTime
    assert DriverRead.of(since, engine) is not None
    east = timezone(timedelta(hours=2))
    for moment, found in ((datetime.now(east) - timedelta(hours=1), [token_id]),
                          (datetime.now(east) + timedelta(hours=1), [])):
        with pg_db.read() as s:
            expected = list(s.execute(since, {"since": moment}).scalars())
        assert expected == found
        assert [r.id for r in pg_db.read_rows(since, {"since": moment})] == expected


def test_the_states_of_held_runs_come_through_the_driver_as_through_sqlalchemy(pg_db):
    """The executor's quarter-second read of the runs it holds: the ids as one array, a fixed
    SQL, on the driver; the same rows as SQLAlchemy's ``IN``."""
    run_ids = [_queued_run(pg_db), *(post(pg_db, make_session(pg_db)).run_id for _ in range(2))]
    asked = [*run_ids[:2], "run_none"]
    statement, params = run_states_read(asked, postgres=True)
    _backend_pid(pg_db)  # the engine has connected: the driver path is open
    assert DriverRead.of(statement, pg_db.primary_read_engine) is not None
    through_driver = sorted(tuple(r) for r in pg_db.read_rows(statement, params, primary=True))
    in_statement, in_params = run_states_read(asked, postgres=False)
    with pg_db.read() as s:
        through_sqlalchemy = sorted(tuple(r) for r in s.execute(in_statement, in_params))
    assert through_driver == through_sqlalchemy
    assert [r[:2] for r in through_driver] == sorted((r, "queued") for r in run_ids[:2])
    assert pg_db.read_rows(*run_states_read([], postgres=True)) == []


def test_a_statement_whose_sql_is_completed_at_execution_is_left_to_sqlalchemy(pg_db):
    """An ``in_`` of a list is expanded into the SQL at each execution: compiled once for the
    driver it would be sent with a placeholder psycopg cannot fill."""
    run_id = _queued_run(pg_db)
    listed = select(AgentRun.status).where(AgentRun.id.in_([run_id, "run_none"]))
    assert DriverRead.of(listed, pg_db.primary_read_engine) is None
    with pg_db.write() as s:
        assert read_all(s, listed, {}) == [("queued",)]


def test_the_stored_events_a_runs_ending_reads_come_through_the_driver_as_through_sqlalchemy(
        pg_db):
    from ingest.events import _ENDING_READS, append_events
    from ingest.leases import claim_runs

    run_id = _queued_run(pg_db)
    with pg_db.write() as s:
        assert [c.run_id for c in claim_runs(s, "worker-1")] == [run_id]
        append_events(s, run_id, [("message.delta", {"text": "a"}),
                                  ("usage", {"model": "m", "input_tokens": 3,
                                             "output_tokens": 4, "cost_usd": 0.5}),
                                  ("message.delta", {"text": "b"})])
    for with_deltas, statement in _ENDING_READS.items():
        assert DriverRead.of(statement, pg_db.engine) is not None  # the writes' engine
        with pg_db.write() as s:
            through_driver = read_all(s, statement, {"run_id": run_id})
            expected = s.connection().execute(statement, {"run_id": run_id}).all()
        assert [tuple(r) for r in through_driver] == [tuple(r) for r in expected]
        assert [r[0] for r in through_driver] == (
            ["message.delta", "usage", "message.delta"] if with_deltas else ["usage"])
        assert through_driver[-1 if not with_deltas else 1][1]["input_tokens"] == 3


def test_a_numeric_result_column_is_left_to_sqlalchemy(pg_db):
    """SQLAlchemy converts a numeric by the type the server reports for the result; the driver
    path knows none, so such a read runs the usual way, with the same answer."""
    run_id = _queued_run(pg_db)
    cost = select(AgentRun.usage_cost_usd, AgentRun.status).where(AgentRun.id == bindparam("run_id"))
    assert pg_db.read_row(cost, {"run_id": run_id}) == (None, "queued")
    assert DriverRead.of(cost, pg_db.primary_read_engine) is None


def test_result_columns_are_converted_as_sqlalchemy_converts_them(pg_db):
    run_id = _queued_run(pg_db)
    for stmt in (select(AgentRun.created_at, AgentRun.status, AgentRun.started_at)
                 .where(AgentRun.id == bindparam("run_id")),
                 _lock_statement_of(pg_db)):
        with pg_db.write() as s:
            expected = s.execute(stmt, {"run_id": run_id}).one()
            found = read_one(s, stmt, {"run_id": run_id})
        assert DriverRead.of(stmt, pg_db.engine) is not None
        assert found._fields == tuple(expected._fields)
        assert [type(v) for v in found] == [type(v) for v in expected]
        assert found.created_at == expected.created_at and found.created_at.tzinfo is UTC
        assert found.status == "queued" and found.started_at is None
    with pg_db.write() as s:
        assert read_one(s, stmt, {"run_id": "run_missing"}) is None


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
    with pg_db.read(transaction=True) as s:  # a read transaction on the same pooled connection
        assert s.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
        driver = s.connection().connection.driver_connection
        assert driver.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS


def test_a_connection_killed_under_the_read_fails_as_dbapi_error_and_is_replaced(
        pg_db, pg_url):
    pid = _backend_pid(pg_db)
    libpq = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # On the driver path the dead connection fails as SQLAlchemy's error, marked invalidated
    # (``Database.read_row`` then reads again, on a new connection).
    statement, params = principal_lookup(token_hash="0" * 64)
    engine = pg_db.primary_read_engine
    driver_read = DriverRead.of(statement, engine)
    assert driver_read is not None
    with pytest.raises(DBAPIError) as failed:
        driver_read.one_or_none(engine, params)
    assert failed.value.connection_invalidated
    assert pg_db.read_row(statement, params) is None
    assert _backend_pid(pg_db) != pid


def test_a_failing_statement_in_a_transaction_raises_dbapi_error_and_rolls_back(pg_db):
    from sqlalchemy import literal_column

    bad = select(literal_column("1 / 0", AgentRun.last_event_seq.type).label("x"))
    with pytest.raises(DBAPIError) as failed:
        with pg_db.write() as s:
            read_one(s, bad, {})
    assert isinstance(failed.value.orig, psycopg.errors.DivisionByZero)
    assert not failed.value.connection_invalidated
    with pg_db.write() as s:  # the pool's connection is usable again
        assert s.execute(text("SELECT 1")).scalar_one() == 1


def _lock_statement_of(db):
    from ingest.events import _lock_statement

    with db.write() as s:
        return _lock_statement(s)


def _queued_run(db) -> str:
    make_agent(db)
    return post(db, make_session(db)).run_id


def test_engines_of_one_server_share_one_compilation(pg_db, pg_url):
    from agentledger.core.database import Database

    other = Database(pg_url)
    try:
        for db in (pg_db, other):
            db.read_row(*principal_lookup(token_hash="0" * 64))  # connects
        first = DriverRead.of(_BY_HASH, pg_db.primary_read_engine)
        assert first is not None
        assert DriverRead.of(_BY_HASH, other.primary_read_engine) is first
    finally:
        other.dispose()


def test_an_event_streams_page_through_the_driver_is_the_page_a_session_reads(pg_db):
    from queries.run_events import _VISIBLE_PAGE, events_page, events_page_of, events_page_read

    run_id = _queued_run(pg_db)
    with pg_db.write() as s:  # run.started: a second event, so the page has rows to convert
        from ingest.leases import claim_runs

        assert [c.run_id for c in claim_runs(s, "worker-1")] == [run_id]
    pg_db.read_row(*principal_lookup(token_hash="0" * 64))  # connects the engine
    for visible_to in (None, "alice", "somebody-else"):
        for after in (0, 1, 2):
            stmt, params = events_page_read(run_id, after_seq=after, limit=50,
                                            visible_to=visible_to)
            assert DriverRead.of(stmt, pg_db.primary_read_engine) is not None
            through_driver = events_page_of(pg_db.read_rows(stmt, params, fresh=True), run_id,
                                            after)
            with pg_db.read() as s:
                expected = events_page(s, run_id, after_seq=after, limit=50,
                                       visible_to=visible_to)
            assert through_driver == expected
            if visible_to == "somebody-else":
                assert through_driver is None
            else:
                assert len(through_driver.events) == 2 - after
                assert all(isinstance(e["data"], dict) for e in through_driver.events)
    assert DriverRead.of(_VISIBLE_PAGE, pg_db.primary_read_engine) is not None


# ---- writes ----------------------------------------------------------------------------------


def _stored_events(db, run_id: str) -> list[tuple]:
    from agentledger.core.schema import RunEvent

    with db.read() as s:
        return [tuple(r) for r in s.execute(
            select(RunEvent.seq, RunEvent.type, RunEvent.data, RunEvent.created_at, RunEvent.hash)
            .where(RunEvent.run_id == run_id).order_by(RunEvent.seq)).all()]


def test_a_write_through_the_driver_stores_what_sqlalchemy_stores(pg_db):
    """The same INSERT with a JSON document and a UTC time, once through the driver and once
    through SQLAlchemy: the bind processors are applied alike, so the rows are alike."""
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import insert

    from agentledger.core.database import execute, execute_write
    from agentledger.core.schema import RunEvent

    run_id = _queued_run(pg_db)
    statement = insert(RunEvent.__table__)
    at = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=timezone(timedelta(hours=5)))
    data = {"text": "é ✓ \"quoted\" \\ \n", "nested": {"list": [1, 2.5, None, True]},
            "zero": 0}
    with pg_db.write() as s:
        params = {"run_id": run_id, "seq": 2, "type": "message.delta", "data": data,
                  "created_at": at, "hash": "a" * 64}
        assert DriverWrite.of(statement, s.get_bind().dialect, params) is not None
        assert execute_write(s, statement, params).rowcount == 1
        execute(s, statement, {**params, "seq": 3})
    first, second = _stored_events(pg_db, run_id)[1:]
    assert first[1:] == second[1:]
    assert first[2] == data
    assert first[3] == at and first[3].tzinfo is UTC


def test_the_parameter_names_decide_the_columns_a_driver_write_sets(pg_db):
    from sqlalchemy import update

    from agentledger.core.database import execute_write

    run_id = _queued_run(pg_db)
    statement = update(AgentRun.__table__).where(AgentRun.__table__.c.id == bindparam("run_id_"))
    with pg_db.write() as s:
        dialect = s.get_bind().dialect
        one = DriverWrite.of(statement, dialect, {"run_id_": run_id, "end_reason": "a"})
        other = DriverWrite.of(statement, dialect, {"run_id_": run_id, "redaction_count": 3})
        assert one is not None and other is not None and one is not other
        assert "end_reason" in one.sql and "redaction_count" not in one.sql
        assert execute_write(s, statement, {"run_id_": run_id, "redaction_count": 3}).rowcount == 1
        assert execute_write(s, statement, {"run_id_": "run_none", "redaction_count": 1}
                             ).rowcount == 0
    with pg_db.read() as s:
        assert s.execute(select(AgentRun.redaction_count, AgentRun.end_reason)
                         .where(AgentRun.id == run_id)).one() == (3, None)


def test_a_driver_write_returns_converted_rows(pg_db):
    from sqlalchemy import update

    from agentledger.core.database import execute_write

    run_id = _queued_run(pg_db)
    statement = (update(AgentRun.__table__).where(AgentRun.__table__.c.id == bindparam("run_id_"))
                 .returning(AgentRun.__table__.c.id, AgentRun.__table__.c.created_at))
    with pg_db.write() as s:
        result = execute_write(s, statement, {"run_id_": run_id, "redaction_count": 1})
        row = result.one()
        assert row.id == run_id and row.created_at.tzinfo is UTC
        assert result.first() == row and result.all() == [row]
        none = execute_write(s, statement, {"run_id_": "run_none", "redaction_count": 1})
        assert none.first() is None and none.all() == []
        with pytest.raises(NoResultFound):
            none.one()


def test_a_failing_driver_write_raises_sqlalchemys_error_and_writes_nothing(pg_db):
    """A duplicate event seq is the database's ``IntegrityError`` as SQLAlchemy raises it, and
    the transaction around it leaves nothing behind."""
    from datetime import datetime

    from sqlalchemy import insert
    from sqlalchemy.exc import IntegrityError

    from agentledger.core.database import execute_write
    from agentledger.core.schema import RunEvent

    run_id = _queued_run(pg_db)
    before = _stored_events(pg_db, run_id)
    params = {"run_id": run_id, "seq": 1, "type": "message.delta", "data": {"text": "x"},
              "created_at": datetime.now(UTC), "hash": "b" * 64}
    with pytest.raises(IntegrityError) as failed:
        with pg_db.write() as s:
            execute_write(s, insert(RunEvent.__table__), {**params, "seq": 2})
            execute_write(s, insert(RunEvent.__table__), params)  # seq 1 is run.queued's
    assert isinstance(failed.value.orig, psycopg.errors.UniqueViolation)
    assert not failed.value.connection_invalidated
    assert _stored_events(pg_db, run_id) == before
    with pg_db.write() as s:  # the pool's connection is usable again
        assert s.execute(text("SELECT 1")).scalar_one() == 1


def test_the_head_advance_of_an_append_takes_the_driver_path(pg_db):
    from ingest.events import _EVENTS_ONE, _advance_statement, append_events
    from ingest.leases import claim_runs

    run_id = _queued_run(pg_db)
    with pg_db.write() as s:
        assert [c.run_id for c in claim_runs(s, "worker-1")] == [run_id]
    with pg_db.write() as s:
        result = append_events(s, run_id, [("message.delta", {"text": "hé"})],
                               executor_instance_id="worker-1")
    assert result.seqs == [3]
    compiled = [key for key in DriverWrite._cache  # noqa: SLF001 - which statements compiled
                if key[0] is _advance_statement(_EVENTS_ONE, False, False)]
    assert compiled, "the single-event head advance did not go through the driver"
    assert _stored_events(pg_db, run_id)[-1][1:3] == ("message.delta", {"text": "hé"})


def test_a_claims_locked_read_comes_through_the_driver_as_through_sqlalchemy(pg_db):
    """The claim loop's statement (the runs first in line, locked, and the clock) has fixed SQL,
    so it runs on the driver; its rows are the ones SQLAlchemy reads, snapshots and times
    included, and a claim through it starts the run it found."""
    from ingest.leases import _claim_statement, claim_runs

    first = _queued_run(pg_db)
    second = post(pg_db, make_session(pg_db)).run_id  # another thread: claimable too
    with pg_db.write() as s:
        statement = _claim_statement(s)
        s.connection()  # connected: the dialect knows its server
        assert DriverRead.of(statement, s.get_bind().dialect) is not None
        through_driver = read_all(s, statement, {"max_runs": 5})
        expected = s.connection().execute(statement, {"max_runs": 5}).all()
        s.rollback()
    assert [r.id for r in through_driver] == [first, second]
    for found, read in zip(through_driver, expected, strict=True):
        assert found._fields == read._fields
        for name in found._fields:
            if name != "now":  # the clock of each statement's own moment
                assert getattr(found, name) == getattr(read, name), name
                assert type(getattr(found, name)) is type(getattr(read, name)), name
        assert found.now.tzinfo is UTC and found.agent_execution_snapshot["agent_id"]
    with pg_db.write() as s:
        claimed = claim_runs(s, "worker-1", max_runs=5)
    assert [c.run_id for c in claimed] == [first, second]
    with pg_db.write() as s:
        assert claim_runs(s, "worker-2", max_runs=5) == []
