"""A request that fails because the database could not be used answers
``503 database_unavailable`` with ``Retry-After: 1`` and the error envelope, never a 500, and
logs one warning line; a single-statement read on a connection the server closed is run again.

On PostgreSQL the app's connections are terminated between requests (``pg_terminate_backend``,
as an operator, a fail-over or a restart would); the pools' ping after idling is switched off,
so the next request certainly meets the dead connections. On SQLite a writer holds the file
past a shortened busy timeout.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import OperationalError as SAOperationalError
from support.api import FlaskApi, assert_error, open_session, send, unique, wait_until

from agentledger.core import database
from agentledger.core.database import Database, connection_failed
from queries.principals import principal_lookup

DATABASE_LOG = "agentledger.api"


def _libpq(url: str, database_name: str | None = None) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    if database_name is not None:
        parsed = parsed.set(database=database_name)
    return parsed.render_as_string(hide_password=False)


def _admin(url: str) -> psycopg.Connection:
    """A connection to the server's ``postgres`` database: it works while the test database
    refuses connections, and is never among the sessions terminated."""
    return psycopg.connect(_libpq(url, "postgres"), autocommit=True)


def _app_backends(url: str) -> set[int]:
    with _admin(url) as admin:
        rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                             (make_url(url).database,))
        return {pid for (pid,) in rows}


def _terminate(url: str, pids: set[int]) -> None:
    """End these sessions, and wait until they have ended (the signal alone returns at once)."""
    with _admin(url) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_until(lambda: not _app_backends(url) & pids, timeout=10,
               message="the terminated sessions to end")


def _terminate_all(url: str) -> set[int]:
    """What the chaos test did: every session of the database."""
    pids = _app_backends(url)
    _terminate(url, pids)
    return pids


def _assert_unavailable(reply) -> None:
    assert_error(reply, 503, "database_unavailable")
    assert reply.headers.get("Retry-After") == "1", reply.headers


def _outage_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == DATABASE_LOG and "database unavailable" in r.getMessage()]


@pytest.fixture
def outage_api(pg_url, monkeypatch) -> Iterator[FlaskApi]:
    """The API on PostgreSQL with pooled connections never pinged before use: a connection the
    server closed is handed to the next request, however slowly the test runs."""
    monkeypatch.setattr(database, "PING_AFTER_IDLE_SECONDS", 3600.0)
    db = Database(pg_url)
    app = FlaskApi(db, pg_url)
    try:
        yield app
    finally:
        app.close()
        db.dispose()


@pytest.fixture
def unpinged_db(pg_url, monkeypatch) -> Iterator[Database]:
    monkeypatch.setattr(database, "PING_AFTER_IDLE_SECONDS", 3600.0)
    db = Database(pg_url)
    yield db
    db.dispose()


# ---- PostgreSQL: the Database after the server closed its connections --------------------------


@pytest.mark.pg_only
def test_a_single_statement_read_runs_once_more_on_a_live_connection(unpinged_db, pg_url):
    db = unpinged_db
    stmt, params = principal_lookup(token_hash="0" * 64)
    assert db.read_row(stmt, params) is None  # connected: the driver path is open
    with db.read() as first, db.read() as second:  # two pooled connections, both to be killed
        first.execute(text("SELECT 1"))
        second.execute(text("SELECT 1"))
    _terminate_all(pg_url)
    assert db.read_row(stmt, params) is None
    _terminate_all(pg_url)
    assert db.read_rows(stmt, params) == []


@pytest.mark.pg_only
def test_a_read_block_and_a_write_are_not_run_again_but_the_next_ones_work(unpinged_db, pg_url):
    db = unpinged_db
    with db.write() as s, db.read() as r:  # a pooled connection in each engine
        s.execute(text("SELECT 1"))
        r.execute(text("SELECT 1"))
    _terminate_all(pg_url)
    with pytest.raises(DBAPIError) as failed:
        with db.read() as s:
            s.execute(text("SELECT 1"))
    assert failed.value.connection_invalidated
    with db.write() as s:  # the write engine's pool was renewed by the read's failure
        s.execute(text("SELECT 1"))

    _terminate_all(pg_url)
    sent: list[str] = []
    event.listen(db.engine, "before_cursor_execute",
                 lambda _conn, _cursor, statement, *_rest: sent.append(statement))
    with pytest.raises(DBAPIError) as failed:
        with db.write() as s:
            s.execute(text("SELECT 2"))
    assert failed.value.connection_invalidated and sent == ["SELECT 2"]  # sent once
    with db.read() as s:  # and the read pool was renewed by the write's failure
        assert s.execute(text("SELECT 3")).scalar_one() == 3


@pytest.mark.pg_only
def test_a_connection_in_use_when_the_pools_are_renewed_is_closed_not_left_open(unpinged_db):
    """Renewing the pools replaces every connection opened until then, also one another thread
    holds at that moment: once given back it is closed at the next checkout (or when the pool
    is disposed), never left open for the garbage collector (psycopg's ResourceWarning)."""
    db = unpinged_db
    held = db.engine.connect()
    held.execute(text("SELECT 1"))
    raw = held.connection.dbapi_connection
    db._renew_pools()  # as after another thread's statement found its connection closed
    held.close()  # given back after the renewal
    with db.engine.connect() as again:
        again.execute(text("SELECT 1"))
        assert again.connection.dbapi_connection is not raw  # replaced, not reused
    assert raw is not None and raw.closed


# ---- PostgreSQL: the server closes the app's connections ---------------------------------------


@pytest.mark.pg_only
def test_reads_after_the_server_closed_every_connection_succeed(outage_api, pg_url, caplog):
    api = outage_api
    session_id = open_session(api.http, api.alice)["id"]
    run_id = send(api.http, api.alice, session_id).json()["run_id"]
    assert api.db.primary_read_engine.pool.checkedin() > 0  # pooled, idle connections to kill
    closed = _terminate_all(pg_url)
    caplog.set_level(logging.WARNING)

    reply = api.get(f"/api/sessions/{session_id}/messages", api.alice)
    assert reply.status == 200, reply
    assert [m["content"] for m in reply.json()["items"]] == ["hello"]
    reply = api.get(f"/api/agent-runs/{run_id}/events", api.alice)
    assert reply.status == 200, reply

    assert not _app_backends(pg_url) & closed  # the requests ran on new connections
    assert not _outage_warnings(caplog)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.pg_only
def test_a_write_on_a_closed_connection_is_a_503_and_its_retry_succeeds(outage_api, pg_url,
                                                                        caplog):
    api = outage_api
    session_id = open_session(api.http, api.alice)["id"]
    writers = {pid for pid in _app_backends(pg_url) if api.db.writes_through(pid)}
    assert writers and api.db.engine.pool.checkedin() > 0
    _terminate(pg_url, writers)  # the reads still work: only the write meets a dead connection
    caplog.set_level(logging.WARNING)
    key = unique("key")

    reply = send(api.http, api.alice, session_id, "after the outage", key=key, expect=None)
    _assert_unavailable(reply)
    [warning] = _outage_warnings(caplog)
    line = warning.getMessage()
    assert warning.levelno == logging.WARNING and warning.exc_info is None
    assert f"POST /api/sessions/{session_id}/messages" in line
    assert "psycopg" in line and "\n" not in line
    assert "after the outage" not in line and "[SQL" not in line and "parameters" not in line
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

    # The same request again, as the client's retry sends it: one run, the pools renewed.
    retried = send(api.http, api.alice, session_id, "after the outage", key=key)
    again = send(api.http, api.alice, session_id, "after the outage", key=key)
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json()["run_id"] == retried.json()["run_id"]
    assert not _app_backends(pg_url) & writers


@pytest.mark.pg_only
def test_a_cancel_on_a_closed_connection_is_a_503_then_it_is_accepted(outage_api, pg_url):
    api = outage_api
    session_id = open_session(api.http, api.alice)["id"]
    run_id = send(api.http, api.alice, session_id).json()["run_id"]
    _terminate(pg_url, {pid for pid in _app_backends(pg_url) if api.db.writes_through(pid)})

    _assert_unavailable(api.post(f"/api/agent-runs/{run_id}/cancel", api.alice))
    reply = api.post(f"/api/agent-runs/{run_id}/cancel", api.alice)
    assert reply.status == 202, reply
    assert reply.json()["status"] == "cancelled"


@pytest.mark.pg_only
def test_requests_between_terminations_are_answered_or_503_never_500(outage_api, pg_url):
    api = outage_api
    session_id = open_session(api.http, api.alice)["id"]
    statuses = []
    for turn in range(12):
        if turn % 2:
            _terminate_all(pg_url)
        else:  # the writer's alone: the request's reads work and its write fails
            _terminate(pg_url, {pid for pid in _app_backends(pg_url)
                                if api.db.writes_through(pid)})
        posted = send(api.http, api.alice, session_id, expect=None)
        replies = [posted]
        if posted.status == 202:
            run_id = posted.json()["run_id"]
            replies.append(api.post(f"/api/agent-runs/{run_id}/cancel", api.alice))
            replies.append(api.get(f"/api/agent-runs/{run_id}/events", api.alice))
        replies.append(api.get(f"/api/sessions/{session_id}/messages", api.alice))
        for reply in replies:
            if reply.status == 503:
                _assert_unavailable(reply)
            else:
                assert reply.status in (200, 202), reply
            statuses.append(reply.status)
    assert 503 in statuses  # the writer-only terminations: a write cannot be retried
    assert statuses.count(503) <= 6, statuses


@pytest.mark.pg_only
def test_while_the_database_refuses_connections_requests_are_503(outage_api, pg_url):
    api = outage_api
    session_id = open_session(api.http, api.alice)["id"]
    name = make_url(pg_url).database
    with _admin(pg_url) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            _terminate_all(pg_url)
            _assert_unavailable(api.get(f"/api/sessions/{session_id}/messages", api.alice))
            _assert_unavailable(api.get("/api/health"))
            _assert_unavailable(send(api.http, api.alice, session_id, expect=None))
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    reply = api.get(f"/api/sessions/{session_id}/messages", api.alice)
    assert reply.status == 200, reply
    assert api.get("/api/health").status == 200


# ---- SQLite: the file stays locked past the busy timeout ---------------------------------------


def test_sqlite_locked_past_the_busy_timeout_is_a_503(sqlite_template, tmp_path, monkeypatch,
                                                      caplog):
    path = tmp_path / "agentledger.db"
    shutil.copy(sqlite_template, path)
    url = f"sqlite:///{path}"
    monkeypatch.setattr(database, "BUSY_TIMEOUT_SECONDS", 0.2)  # the engines' sqlite3 timeout
    db = Database(url)
    api = FlaskApi(db, url)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process's writer, holding the file
        caplog.set_level(logging.WARNING)
        _assert_unavailable(api.post("/api/sessions", api.alice, json={"agent_id": "echo"}))
        [warning] = _outage_warnings(caplog)
        assert "sqlite3.OperationalError: database is locked" in warning.getMessage()
        holder.execute("ROLLBACK")
        assert api.post("/api/sessions", api.alice, json={"agent_id": "echo"}).status == 201
    finally:
        holder.close()
        api.close()
        db.dispose()


# ---- what counts as the database being unavailable ---------------------------------------------


def _wrapped(orig: BaseException, *, invalidated: bool = False) -> DBAPIError:
    return DBAPIError.instance("SELECT 1", {}, orig, psycopg.Error,
                               connection_invalidated=invalidated)


def _sqlite_statement_error() -> sqlite3.OperationalError:
    holder = sqlite3.connect(":memory:")
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("BEGIN IMMEDIATE")  # a transaction within a transaction: not "locked"
    except sqlite3.OperationalError as exc:
        nested = exc
    finally:
        holder.close()
    assert "locked" not in str(nested)
    return nested


def test_connection_failures_are_told_from_statement_errors(tmp_path):
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    waiter = sqlite3.connect(path, timeout=0, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as locked:
        waiter.execute("BEGIN IMMEDIATE")
    holder.close()
    waiter.close()

    unavailable = [
        psycopg.OperationalError("connection failed: Connection refused"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.CannotConnectNow("the database system is starting up"),
        psycopg.errors.TooManyConnections("sorry, too many clients already"),
        psycopg.errors.ConnectionFailure("connection failure"),
        _wrapped(psycopg.OperationalError("consuming input failed")),
        _wrapped(psycopg.errors.AdminShutdown("terminating connection")),
        _wrapped(psycopg.Error("the connection is closed"), invalidated=True),
        SAOperationalError("BEGIN IMMEDIATE", {}, locked.value),
    ]
    statement_errors = [
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.LockNotAvailable("could not obtain lock on row"),
        psycopg.errors.PipelineAborted("pipeline aborted"),
        _wrapped(psycopg.errors.DivisionByZero("division by zero")),
        IntegrityError("INSERT", {}, psycopg.errors.UniqueViolation("duplicate key")),
        SAOperationalError("BEGIN", {}, _sqlite_statement_error()),
        RuntimeError("connection failed"),
    ]
    assert [connection_failed(exc) for exc in unavailable] == [True] * len(unavailable)
    assert [connection_failed(exc) for exc in statement_errors] == [False] * len(statement_errors)


@pytest.mark.parametrize("raised", [
    psycopg.OperationalError("connection failed: connection to server at \"10.0.0.9\", port "
                             "5432 failed: Connection refused"),
    _wrapped(psycopg.errors.AdminShutdown("terminating connection due to administrator command"
                                          "\nSECOND LINE")),
], ids=["unreachable", "terminated"])
def test_a_view_failing_on_the_connection_is_a_503_on_either_database(api, monkeypatch, caplog,
                                                                      raised):
    import agentledger.api.routes_sessions as routes

    def lost(*args, **kwargs):
        raise raised

    monkeypatch.setattr(routes, "list_sessions", lost)
    caplog.set_level(logging.WARNING)
    _assert_unavailable(api.get("/api/sessions", api.alice))
    [warning] = _outage_warnings(caplog)
    assert warning.getMessage().startswith("database unavailable on GET /api/sessions: psycopg")
    assert "SECOND LINE" not in warning.getMessage() and warning.exc_info is None


def test_any_other_database_error_is_still_a_500(api, monkeypatch, caplog):
    import agentledger.api.routes_sessions as routes

    def timed_out(*args, **kwargs):
        raise _wrapped(psycopg.errors.QueryCanceled("canceling statement due to statement "
                                                    "timeout"))

    monkeypatch.setattr(routes, "list_sessions", timed_out)
    caplog.set_level(logging.WARNING)
    assert_error(api.get("/api/sessions", api.alice), 500, "internal_error")
    assert not _outage_warnings(caplog)
    assert [r.exc_info is not None for r in caplog.records if r.name == DATABASE_LOG] == [True]
