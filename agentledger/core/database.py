"""Database lifecycle: engines, sessions and the per-dialect connection setup.

Two engines per process: a writer used only by ``ingest`` and the entry points that drive it,
and a reader used by ``queries`` whose connections refuse writes (``PRAGMA query_only`` on
SQLite, ``default_transaction_read_only`` on PostgreSQL). Entry points own the transaction:
``with db.write() as s: ingest.…(s, …)`` commits on success and rolls back on any error.

With a read replica (``AGENTLEDGER_READ_DATABASE_URL``) on PostgreSQL, a read goes to the replica
only once it has replayed the primary's WAL up to the position the primary reported when the
read began (``ReplicaGate``): a reader sees every commit made before it started, its own included,
whichever process or server made it. A replica that has not caught up within a short wait, or
that cannot be reached, leaves the read to the primary. Inside a web request
(``begin_read_scope``) the choice is made once and kept for the request's other reads; after a
write the request reads the primary. Writers, executors and the reconciler read with
``primary=True``.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any, cast

import psycopg
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InvalidatePoolError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from agentledger.core.config import sqlite_path
from agentledger.core.driver_statements import (
    AutocommitConnection,
    DriverRead,
    DriverResult,
    DriverWrite,
    WriteResult,
)
from agentledger.core.errors import ReplicaUnavailable
from agentledger.core.redaction import SESSION_KEY as REDACTOR_KEY
from agentledger.core.redaction import Redactor, install_log_redaction
from agentledger.core.socket_deadlines import SocketDeadline
from agentledger.core.sqlite_writers import BUSY_TIMEOUT_SECONDS, writer_turn, writer_turns

READ_STATEMENT_TIMEOUT_MS = 30_000
PENDING_NOTIFICATIONS = "agentledger_pending_notifications"
REPLICA_CONNECT_TIMEOUT_SECONDS = 2
DEFAULT_REPLICA_MAX_WAIT_MS = 100
DEFAULT_REPLICA_RETRY_SECONDS = 5.0
LAGGING_SECONDS = 1.0  # after a wait in vain, reads do not wait for the replica this long
PING_AFTER_IDLE_SECONDS = 1.0  # a primary connection idle this long is pinged before use
REPLICA_APPLICATION_NAME = "agentledger-replica-read"
SINGLE_STATEMENT = "agentledger_single_statement"  # execution option: a SQLite read begins nothing

log = logging.getLogger("agentledger.core.database")


def normalize_url(url: str) -> str:
    """Accept the URL forms people paste (``postgres://``, ``postgresql://``) and use psycopg 3."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


@contextmanager
def one_off_connection(url: str, *, begin: bool = False) -> Iterator[Connection]:
    """One connection to ``url`` for a command's single job (a migration, an inspection, a
    settings check), closed with its engine afterwards; ``begin``: inside a transaction that
    commits when the block ends."""
    engine = create_engine(normalize_url(url), poolclass=NullPool)
    try:
        with engine.begin() if begin else engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


def backend_name(url: str) -> str:
    """``postgresql`` or ``sqlite`` for a URL in any form ``normalize_url`` accepts."""
    return make_url(normalize_url(url)).get_backend_name()


def _unicode_lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def _sqlite_engine(url: str, *, read_only: bool) -> Engine:
    path = sqlite_path(url)
    if path is None:
        raise SystemExit("agentledger needs a SQLite file (sqlite:///path), not an in-memory database")
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_SECONDS,
                                              "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Take transaction control away from the sqlite3 module so that BEGIN is ours.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        # SQLite's own lower() folds ASCII letters only, so a case-insensitive search
        # (``lower(content) LIKE lower(:text)``) missed 'École' for 'école'; Python's folds every
        # script, as PostgreSQL's lower() does.
        dbapi_connection.create_function("lower", 1, _unicode_lower, deterministic=True)
        if read_only:
            cursor.execute("PRAGMA query_only=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        if connection.get_execution_options().get(SINGLE_STATEMENT):
            return  # a statement alone is atomic: no BEGIN ... COMMIT around it
        # Writers take the write lock up front: no deadlock-prone lock upgrades, and the
        # transaction is the serialisation point that PostgreSQL gets from row locks.
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


def execute(session: Session, statement, params=None):
    """Run a statement that reads or writes columns (no ORM objects) on the session's
    connection, in its transaction, past the ORM's per-execution layer: a statement built of
    mapped attributes (``AgentRun.status``) is otherwise executed through the ORM's compile
    state and result loading, about 80 µs more CPU per execution (measured on the event page
    read). For the statements that run for every request, claim or append."""
    return session.connection().execute(statement, params)


def read_one(session: Session, statement, params: dict):
    """The one row (or None) of a single-row read in the session's transaction; on PostgreSQL
    through the connection's driver when ``core.driver_statements`` can run it (about half the
    CPU). For the locked-row read of every append."""
    driver_read = _driver_read_in(session, statement)
    if driver_read is not None:
        return driver_read.one_or_none_in(session, params)
    return execute(session, statement, params).one_or_none()


def read_all(session: Session, statement, params: dict) -> list:
    """Every row of a read in the session's transaction, as ``read_one`` reads it. For the
    stored events a run's ending sums and joins, and the rows a claim locks."""
    driver_read = _driver_read_in(session, statement)
    if driver_read is not None:
        return driver_read.all_in(session, params)
    return list(execute(session, statement, params).all())


def execute_write(session: Session, statement, params: dict) -> WriteResult:
    """Run one of the writes every append or claim makes (one set of parameters) in the
    session's transaction; on PostgreSQL through the connection's driver
    (``core.driver_statements``: about 100 µs less CPU for the head advance of a single-event
    append). The result answers ``rowcount``, ``one()``, ``first()``, ``all()`` and ``close()``
    either way."""
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        driver_write = DriverWrite.of(statement, bind.dialect, params)
        if driver_write is not None:
            return driver_write.execute_in(session, params)
    return cast(WriteResult, execute(session, statement, params))  # a CursorResult


class AutocommitWrites:
    """What ``Database.autocommit_writes`` yields: a PostgreSQL write connection on which each
    statement is a transaction of its own, committed when it returns, and the notifications
    those statements sent (``notified``), handed to this process's listeners when the block
    ends. The statements go through the driver (``core.driver_statements``)."""

    __slots__ = ("connection", "dialect", "notifications")

    def __init__(self, connection: AutocommitConnection, dialect):
        self.connection = connection
        self.dialect = dialect
        self.notifications: list[tuple[str, str]] = []

    def read_one(self, statement, params: dict):
        """The one row (or None) of a read."""
        read = DriverRead.of(statement, self.dialect)
        if read is None:
            raise TypeError("autocommit_writes runs statements the driver can run alone")
        return read.one_or_none_on(self.connection, params)

    def write(self, statement, params: dict) -> DriverResult:
        """Run a write: committed when this returns (or rolled back when it raises)."""
        write = DriverWrite.of(statement, self.dialect, params)
        if write is None:
            raise TypeError("autocommit_writes runs statements the driver can run alone")
        return write.execute_on(self.connection, params)

    def notified(self, channel: str, payload: str) -> None:
        """A statement that committed sent this NOTIFY itself (other processes hear it)."""
        self.notifications.append((channel, payload))


def _driver_read_in(session: Session, statement) -> DriverRead | None:
    bind = session.get_bind()
    if bind.dialect.name != "postgresql":
        return None
    return DriverRead.of(statement, bind.dialect)


def _track_backend_pids(engine: Engine, pids: set[int]) -> None:
    """Keep ``pids`` equal to the server process ids of the engine's open connections."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, record):
        record.info["backend_pid"] = pid = dbapi_connection.info.backend_pid
        pids.add(pid)

    @event.listens_for(engine, "close")
    def _on_close(_dbapi_connection, record):
        pids.discard(record.info.get("backend_pid"))

    @event.listens_for(engine, "close_detached")
    def _on_close_detached(dbapi_connection):
        pids.discard(dbapi_connection.info.backend_pid)


def _ping_after_idle(engine: Engine, idle_seconds: float) -> None:
    """Check a pooled connection before use only when it sat idle for ``idle_seconds``.

    A connection that served a request a moment ago is alive unless the server went away in
    that moment; a ping on every checkout costs every request a round trip for that case. A
    connection that idled longer (across a server restart, an idle-session timeout, a dropped
    network path) is pinged, and a dead one is replaced before the caller sees it (raising
    ``DisconnectionError`` in ``checkout`` makes the pool retry with a new connection). A
    connection that dies in the short window fails its statement instead; SQLAlchemy then
    invalidates the pool, so every other connection of that moment is replaced too.
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection, record):
        if record is not None:
            record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection, record, _proxy):
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < idle_seconds:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)  # SELECT 1, outside any transaction
        except psycopg.Error as exc:
            raise DisconnectionError(f"pooled connection is dead: {exc}") from exc
        finally:
            record.info.pop("idle_since", None)


def _postgres_engine(url: str, *, read_only: bool, replica: bool = False) -> Engine:
    options = "-c timezone=UTC"
    if read_only:
        options += (
            " -c default_transaction_read_only=on"
            f" -c statement_timeout={READ_STATEMENT_TIMEOUT_MS}"
        )
    connect_args: dict = {"options": options}
    if replica:
        # A stopped or unreachable replica must cost a read a bounded moment, not a hang; the
        # name tells the replica's pg_stat_activity which sessions are agentledger's reads.
        connect_args["connect_timeout"] = REPLICA_CONNECT_TIMEOUT_SECONDS
        connect_args["application_name"] = REPLICA_APPLICATION_NAME
    engine = create_engine(
        url,
        # At most 30 connections per engine, as many as a process's busy moments use; 20 of them
        # stay open between bursts. With fewer kept (10), 50 concurrent clients of a serve
        # worker opened and closed ~10 connections a second (a PostgreSQL backend started and
        # torn down each time) and did 61 trivial runs/s instead of 77.
        pool_size=20,
        max_overflow=10,
        connect_args=connect_args,
    )
    if replica:
        _bound_replica_waits(engine)
    else:
        _ping_after_idle(engine, PING_AFTER_IDLE_SECONDS)
    return engine


_DEADLINE_KEY = "agentledger_statement_deadline"


def _bound_replica_waits(engine: Engine) -> None:
    """A replica's connections are checked at every checkout, so that a stopped standby sends
    the read to the primary before it starts rather than failing it half-way; and a replica
    that hangs without closing its connections (a frozen host, a network partition) costs a
    read a bounded moment (``core.socket_deadlines``): the check at most
    ``REPLICA_CONNECT_TIMEOUT_SECONDS``, a statement at most what the replica's own
    ``statement_timeout`` allows and as long again as a connect. Without them a hung replica
    held every request thread of a server, health checks and writes included, until it woke.
    A server-side cursor's later fetches are not bounded: ``agentledger verify``, which reads
    its chains through one, waits for a replica that hangs part-way."""
    ping = SocketDeadline(REPLICA_CONNECT_TIMEOUT_SECONDS, "agentledger-replica-check")
    statements = SocketDeadline(READ_STATEMENT_TIMEOUT_MS / 1000 + REPLICA_CONNECT_TIMEOUT_SECONDS,
                                "agentledger-replica-statements")

    @event.listens_for(engine, "checkout")
    def _check(dbapi_connection, _record, _proxy):
        key = ping.arm(dbapi_connection.fileno())
        failure = None
        try:
            engine.dialect.do_ping(dbapi_connection)  # SELECT 1, outside any transaction
        except psycopg.Error as exc:
            failure = exc
        if ping.disarm(key):
            # Not a disconnection: the pool would connect again at once, to the same hung
            # server. The read goes to the primary (``_REPLICA_FAILURES``), and the replica is
            # left alone for the back-off.
            raise TimeoutError(f"the read replica did not answer within "
                               f"{REPLICA_CONNECT_TIMEOUT_SECONDS}s")
        if failure is not None:
            raise InvalidatePoolError(f"pooled replica connection is dead: {failure}") from failure

    @event.listens_for(engine, "before_cursor_execute")
    def _arm(conn, cursor, *_args):
        conn.info[_DEADLINE_KEY] = statements.arm(cursor.connection.fileno())

    def _disarm(info) -> None:
        key = info.pop(_DEADLINE_KEY, None)
        if key is not None:
            statements.disarm(key)

    @event.listens_for(engine, "after_cursor_execute")
    def _executed(conn, *_args):
        _disarm(conn.info)

    @event.listens_for(engine, "handle_error")
    def _failed(context):
        if context.connection is not None:
            _disarm(context.connection.info)

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection, record):
        if record is not None:
            _disarm(record.info)


def outside_transaction(session: Session) -> bool:
    """True when ``session``'s statements run outside a transaction (``Database.read`` on
    PostgreSQL's primary): SET LOCAL does nothing there and a server-side cursor cannot live."""
    return session.connection().get_execution_options().get("isolation_level") == "AUTOCOMMIT"


class _ReadScope:
    """The replica decision of one web request (``Database.begin_read_scope``): made by its first
    read, kept by the others; a write in the request sends the rest to the primary."""

    __slots__ = ("db", "use_replica")

    def __init__(self, db: Database):
        self.db = db
        self.use_replica: bool | None = None  # None: not decided yet


_scope: ContextVar[_ReadScope | None] = ContextVar("agentledger_read_scope", default=None)


class ReplicaGate:
    """Whether a PostgreSQL streaming replica (hot standby) may serve a read.

    ``target()`` asks the primary for its WAL write position (``pg_current_wal_lsn()``: no
    table, one round trip). ``caught_up(connection, lsn)`` asks the replica, on the connection
    the read will use, whether ``pg_last_wal_replay_lsn()`` has reached it, polling for at most
    ``max_wait`` seconds (not at all for ``LAGGING_SECONDS`` after such a wait ended in vain:
    the replica is far behind, so reads check once and go to the primary). Every transaction
    committed before ``target()`` ran has its commit record below that position, so a snapshot
    taken on the replica afterwards sees it. A read URL that is not a standby
    (``pg_last_wal_replay_lsn()`` is NULL outside recovery) is used as it is, without the
    guarantee.

    ``down()`` records a failure to reach the replica: for ``retry_seconds`` reads go straight
    to the primary, and one warning is logged per such back-off.
    """

    _CAUGHT_UP = text("SELECT pg_last_wal_replay_lsn() >= CAST(:lsn AS pg_lsn)")
    _TARGET = text("SELECT pg_current_wal_lsn()")

    def __init__(self, primary: Engine, *, max_wait: float, retry_seconds: float):
        self._primary = primary.execution_options(isolation_level="AUTOCOMMIT")
        self.max_wait = max_wait
        self.retry_seconds = retry_seconds
        self._down_until = 0.0
        self._lagging_until = 0.0
        self._lock = threading.Lock()

    def target(self) -> str:
        with self._primary.connect() as connection:
            return connection.execute(self._TARGET).scalar_one()

    def caught_up(self, connection: Connection, lsn: str) -> bool:
        now = time.monotonic()
        # A replica that just failed to catch up within the wait is far behind: for a moment,
        # reads check it once and go to the primary at once rather than each wait in vain.
        deadline = now if now < self._lagging_until else now + self.max_wait
        pause = 0.001
        while True:
            reached = connection.execute(self._CAUGHT_UP, {"lsn": lsn}).scalar()
            if reached is None or reached:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                if deadline > now:
                    self._lagging_until = time.monotonic() + LAGGING_SECONDS
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.02)

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def down(self, exc: BaseException) -> None:
        with self._lock:
            if time.monotonic() < self._down_until:
                return  # another read saw it first: one warning per back-off
            self._down_until = time.monotonic() + self.retry_seconds
        log.warning("read replica unreachable (%s); reading the primary for the next %gs",
                    _first_line(exc), self.retry_seconds)


def _first_line(exc: BaseException) -> str:
    message = str(getattr(exc, "orig", None) or exc).strip()
    return message.splitlines()[0] if message else type(exc).__name__


# PostgreSQL errors that end or refuse the session rather than fail the statement: the server
# terminated the backend or shut down (57P01 admin_shutdown, 57P02 crash_shutdown), is starting
# or stopping (57P03 cannot_connect_now), or has no connection slot left (53300); class 08 is
# the connection exceptions.
_SESSION_LOST_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def connection_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the database failing the request as a whole rather than its
    statement: the connection was closed by the server or the network, the server cannot be
    reached or refuses connections, or (SQLite) the file stayed locked past the busy timeout.
    Worth trying again a moment later; a statement's own error (a constraint, a statement
    timeout, bad SQL) is not."""
    cause: BaseException | None = exc
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        cause = exc.orig
    if isinstance(cause, psycopg.OperationalError):
        state = cause.sqlstate
        if state is None:  # libpq's own: refused, timed out, closed, lost
            return not isinstance(cause, psycopg.errors.PipelineAborted)
        return state.startswith("08") or state in _SESSION_LOST_SQLSTATES
    if isinstance(cause, sqlite3.OperationalError):
        code = getattr(cause, "sqlite_errorcode", None)
        return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY
    return False


# What a replica that cannot be reached (stopped, refusing, timing out, pool exhausted) raises.
_REPLICA_FAILURES = (DBAPIError, PoolTimeout, OSError)


class Database:
    """The engines of one process. Create once per process; call ``dispose`` on shutdown."""

    def __init__(self, url: str, read_url: str | None = None, *, redaction_rules: tuple = (),
                 replica_max_wait_ms: int = DEFAULT_REPLICA_MAX_WAIT_MS,
                 replica_retry_seconds: float = DEFAULT_REPLICA_RETRY_SECONDS):
        self.url = normalize_url(url)
        # What ``ingest`` redacts before storing (``agentledger.core.redaction``): handed to
        # every write session, so each write path finds it without another parameter.
        self.redactor = Redactor(tuple(redaction_rules))
        self.dialect = make_url(self.url).get_backend_name()
        if self.dialect not in ("sqlite", "postgresql"):
            raise SystemExit(f"unsupported database {self.dialect!r}: use sqlite or postgresql")
        factory = _sqlite_engine if self.dialect == "sqlite" else _postgres_engine
        self.engine = factory(self.url, read_only=False)
        self.read_url = normalize_url(read_url) if read_url else None
        if self.read_url and make_url(self.read_url).get_backend_name() != self.dialect:
            raise SystemExit("AGENTLEDGER_READ_DATABASE_URL must be the same kind of database "
                             f"as AGENTLEDGER_DATABASE_URL ({self.dialect})")
        if self.read_url and self.is_postgres:
            self.read_engine = _postgres_engine(self.read_url, read_only=True, replica=True)
        else:
            self.read_engine = factory(self.read_url or self.url, read_only=True)
        # Reads that must see the latest commits (writers, executors, the reconciler, and a
        # request right after its own write) go to the primary even when a replica serves the
        # other reads.
        self.primary_read_engine = (
            factory(self.url, read_only=True) if self.read_url else self.read_engine
        )
        # On PostgreSQL a replica serves a read only once it has replayed what the primary had
        # written when the read began; a SQLite "replica" (a copy, in tests) is read as it is.
        self.replica_gate = (
            ReplicaGate(self.primary_read_engine, max_wait=replica_max_wait_ms / 1000,
                        retry_seconds=replica_retry_seconds)
            if self.read_url and self.is_postgres else None
        )
        self._listeners: list[Callable[[str, str], None]] = []
        # SQLite: this process's writers wait for their turn here rather than in SQLite's
        # sleeping busy handler (``core.sqlite_writers``).
        self._writer_turns = (None if self.is_postgres
                              else writer_turns(sqlite_path(self.url) or self.url))
        # PostgreSQL: the server processes behind the write engine's connections, whose NOTIFYs
        # ``write`` also hands to this process's listeners after their commit.
        self._backend_pids: set[int] = set()
        if self.is_postgres:
            _track_backend_pids(self.engine, self._backend_pids)

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction: commits when the block ends, rolls back if it raises.

        After a successful commit, the notifications the transaction queued (``dialect.notify``)
        are handed to this process's listeners too, so waiters in the same process wake at once
        on either database (other processes hear them through PostgreSQL's NOTIFY).
        """
        turn = nullcontext() if self._writer_turns is None else writer_turn(self._writer_turns)
        with turn, Session(self.engine, expire_on_commit=False, autoflush=False) as session:
            if self.redactor.active:
                session.info[REDACTOR_KEY] = self.redactor
            with self._renewing_pools_on_loss(), session.begin():  # never retried: the
                yield session                                     # commit may have happened
            pending = session.info.pop(PENDING_NOTIFICATIONS, ())
        self._committed(pending)

    @contextmanager
    def autocommit_writes(self) -> Iterator[AutocommitWrites | None]:
        """PostgreSQL: a connection of the write engine on which each statement commits alone,
        for an operation whose only write is one statement (its reads before it are not
        locked: the write must be a compare-and-set that fails if they changed). It saves the
        ``BEGIN`` and ``COMMIT`` round trips and the ORM session of ``write``. None on SQLite,
        whose writers serialise in ``BEGIN IMMEDIATE``: use ``write``.

        As after ``write``, the notifications the statements sent go to this process's
        listeners when the block ends, and the rest of the request reads the primary."""
        if not self.is_postgres:
            yield None
            return
        with AutocommitConnection(self.engine) as connection:
            alone = AutocommitWrites(connection, self.engine.dialect)
            try:
                with self._renewing_pools_on_loss():
                    yield alone
            finally:
                self._committed(alone.notifications)

    @contextmanager
    def _renewing_pools_on_loss(self) -> Iterator[None]:
        """Renew the primary's pools (``_renew_pools``) when the block fails on a connection
        the server or the network had closed; the error goes on to the caller."""
        try:
            yield
        except DBAPIError as exc:
            if exc.connection_invalidated:
                self._renew_pools()
            raise

    def _renew_pools(self) -> None:
        """A connection to the primary was found closed (by the server or the network). The
        process's other connections to it most likely were too (a restart, a fail-over, an
        operator terminating the database's sessions): both primary pools replace every
        connection opened until now at its next checkout, instead of each dead one failing a
        request of its own. SQLAlchemy renews the pool of a failure it executed itself, but not
        for a statement run on the driver (``core.driver_statements``), nor the other pool."""
        for engine in (self.engine, self.primary_read_engine):
            # What SQLAlchemy does to a pool after a disconnect it saw: every connection opened
            # until now is closed and replaced at its next checkout, those in use included
            # once they are given back. (``dispose`` made a new pool instead, and the old one
            # never closed the connections given back to it after: they stayed open until the
            # garbage collector found them.)
            engine.pool._invalidate(None)  # type: ignore[arg-type]

    def _committed(self, notifications) -> None:
        """What follows a commit: the request reads its own write, listeners hear it."""
        scope = self._request_scope()
        if scope is not None:
            scope.use_replica = False
        for channel, payload in notifications:
            for listener in self._listeners:
                listener(channel, payload)

    def add_notification_listener(self, listener: Callable[[str, str], None]) -> None:
        self._listeners.append(listener)

    def writes_through(self, backend_pid: int) -> bool:
        """Whether a PostgreSQL NOTIFY from ``backend_pid`` was sent by this process's writes:
        their listeners got it from ``write`` already, and its echo through ``LISTEN`` would
        only wake the same waiters again for nothing."""
        return backend_pid in self._backend_pids

    @classmethod
    def from_settings(cls, settings) -> Database:
        rules = settings.redaction_rules()
        install_log_redaction(rules)
        return cls(settings.database_url, settings.read_database_url, redaction_rules=rules,
                   replica_max_wait_ms=settings.read_replica_max_wait_ms,
                   replica_retry_seconds=settings.read_replica_retry_seconds)

    # ---- choosing the replica or the primary -------------------------------------------------

    def begin_read_scope(self) -> None:
        """A web request begins (Flask's ``before_request``): its reads share one
        replica-or-primary decision (the first read makes it), and after a write in it the
        remaining reads go to the primary. ``end_read_scope`` (``teardown_request``) ends it."""
        _scope.set(_ReadScope(self))

    def end_read_scope(self) -> None:
        _scope.set(None)

    def pin_primary(self) -> None:
        """The current request reads the primary from now on (callers that follow runs they
        drive, such as executors over HTTP)."""
        scope = self._request_scope()
        if scope is not None:
            scope.use_replica = False

    def _request_scope(self) -> _ReadScope | None:
        scope = _scope.get()
        return scope if scope is not None and scope.db is self else None

    def _replica_connection(self, engine: Engine, *, fresh: bool = False) -> Connection | None:
        """A connection of ``engine`` (the replica, or its autocommit variant) that may serve
        the read now, or None when the read must go to the primary. ``fresh``: decide for this
        read alone, ignoring the request's decision (a loop that re-reads after notifications)."""
        gate = self.replica_gate
        if gate is None:
            return engine.connect()
        scope = None if fresh else self._request_scope()
        if (scope is not None and scope.use_replica is False) or not gate.available:
            return None
        lsn = None if scope is not None and scope.use_replica else gate.target()
        try:
            connection = engine.connect()
        except _REPLICA_FAILURES as exc:
            gate.down(exc)
            return None
        try:
            ready = lsn is None or gate.caught_up(connection, lsn)
            if not ready:
                connection.close()
        except _REPLICA_FAILURES as exc:
            connection.invalidate()
            connection.close()
            gate.down(exc)
            ready = False
        if scope is not None:
            scope.use_replica = ready
        return connection if ready else None

    def _replica_failed(self, exc: BaseException) -> ReplicaUnavailable | None:
        """What a read that failed on the replica raises instead: a 503 to retry when the
        replica went away (then it is also left alone for the back-off) or cancelled the query
        in a conflict with its recovery; None for any other error (raised as it is)."""
        if self.replica_gate is None or not isinstance(exc, DBAPIError):
            return None
        if exc.connection_invalidated:
            self.replica_gate.down(exc)
            return ReplicaUnavailable("the read replica went away during the read; retry")
        if getattr(exc.orig, "sqlstate", None) == "40001":
            return ReplicaUnavailable("the read replica cancelled the read (a conflict with "
                                      "its recovery); retry")
        return None

    # ---- reads -------------------------------------------------------------------------------

    @contextmanager
    def read(self, *, primary: bool = False, transaction: bool = False) -> Iterator[Session]:
        """Read-only statements (anything that tries to write fails in the database).

        On the replica when one is configured and it has caught up with the primary (see the
        module docstring); ``primary`` reads the primary in any case.

        On PostgreSQL's primary the statements run outside a transaction (autocommit), each
        still refused any write by ``default_transaction_read_only``. Reads run under READ
        COMMITTED, where every statement of a transaction takes its own snapshot anyway, so the
        transaction gave them nothing but a BEGIN and a COMMIT round trip (two of a point
        read's four, the caller's look-up included). ``transaction`` asks for one, for reads
        that need it: a server-side cursor (``yield_per``) lives only inside a transaction.

        Unlike ``read_row``, a read that meets a connection the server closed is not tried
        again: its statements are the caller's block, which only the caller can run again. The
        pools are renewed (``_renew_pools``), so the next read gets a live connection.
        """
        # A lost primary connection renews the pools (the replica's failures are a 503).
        with self._renewing_pools_on_loss():
            connection = None
            if not primary and self.read_url is not None:
                connection = self._replica_connection(self.read_engine)
            if connection is None:
                if self.is_postgres and not transaction:
                    with Session(self._autocommit_primary_engine, autoflush=False) as session:
                        yield session
                    return
                with Session(self.primary_read_engine, autoflush=False) as session:
                    with session.begin():
                        yield session
                return
            with self._on_replica(connection):
                with Session(bind=connection, autoflush=False) as session:
                    with session.begin():
                        yield session
                    # A transaction the gate's check began on the connection ends here.
                    connection.commit()

    def read_row(self, stmt, params: dict | None = None):
        """The one row (or None) of a read that is a single statement.

        On PostgreSQL it runs outside any transaction (autocommit), for the reads every request
        makes (who is calling). On the primary a statement the driver can run
        (``core.driver_statements``) runs on the pooled connection's driver: half the CPU.
        On SQLite it runs without a transaction too (``_single_statement_reads``).

        A statement that fails because the primary had closed its connection (a restart, a
        terminated session) runs once more on a live one (the pools renewed first), so the
        first request after such a moment does not fail for it.
        """
        return self._read_statement(stmt, params, one=True, fresh=False)

    def read_rows(self, stmt, params: dict | None = None, *, fresh: bool = False,
                  primary: bool = False) -> list:
        """Every row of a read that is a single statement, read as ``read_row`` reads it.
        ``fresh``: the replica-or-primary decision is this read's alone, not the request's (a
        loop that re-reads after notifications: an event stream). ``primary``: never the
        replica (an executor following the runs it holds)."""
        return self._read_statement(stmt, params, one=False, fresh=fresh, primary=primary)

    def _read_statement(self, stmt, params: dict | None, *, one: bool, fresh: bool,
                        primary: bool = False, again: bool = False) -> Any:
        def rows_of(result):
            return result.one_or_none() if one else result.all()

        try:
            if not self.is_postgres:
                engine = (self._single_statement_primary_reads if primary
                          else self._single_statement_reads)
                with engine.connect() as connection:
                    return rows_of(connection.execute(stmt, params or {}))
            connection = None
            if self.read_url is not None and not primary:
                connection = self._replica_connection(self._autocommit_read_engine, fresh=fresh)
            if connection is None:
                driver_read = DriverRead.of(stmt, self.primary_read_engine)
                if driver_read is not None:
                    engine = self.primary_read_engine
                    return (driver_read.one_or_none(engine, params) if one
                            else driver_read.all(engine, params))
                with self._autocommit_primary_engine.connect() as on_primary:
                    return rows_of(on_primary.execute(stmt, params or {}))
            with self._on_replica(connection):
                return rows_of(connection.execute(stmt, params or {}))
        except DBAPIError as exc:
            # The pool handed out a connection the server had closed (the replica's failures
            # became ReplicaUnavailable above). One statement on a read-only connection changed
            # nothing: on a live connection it answers as it would have a moment later.
            if again or not exc.connection_invalidated:
                raise
            self._renew_pools()
        return self._read_statement(stmt, params, one=one, fresh=fresh, primary=primary,
                                    again=True)

    @contextmanager
    def _on_replica(self, connection) -> Iterator[None]:
        """Work on a replica connection: a failure of the replica becomes ``ReplicaUnavailable``
        (and starts the back-off); the connection is closed either way."""
        try:
            yield
        except _REPLICA_FAILURES as exc:
            unavailable = self._replica_failed(exc)
            if unavailable is None:
                raise
            raise unavailable from exc
        finally:
            connection.close()

    @functools.cached_property
    def _autocommit_read_engine(self) -> Engine:
        return self.read_engine.execution_options(isolation_level="AUTOCOMMIT")

    @functools.cached_property
    def _single_statement_reads(self) -> Engine:
        """SQLite: the read engine without the transaction its connections begin, for a read
        that is one statement (SQLite reads it from one snapshot anyway); it saves the BEGIN
        and COMMIT around each of a stream's page reads and each request's principal look-up.
        """
        return self.read_engine.execution_options(**{SINGLE_STATEMENT: True})

    @functools.cached_property
    def _single_statement_primary_reads(self) -> Engine:
        """SQLite: ``_single_statement_reads`` of the primary (the same engine when no
        replica is configured)."""
        if self.primary_read_engine is self.read_engine:
            return self._single_statement_reads
        return self.primary_read_engine.execution_options(**{SINGLE_STATEMENT: True})

    @functools.cached_property
    def _autocommit_primary_engine(self) -> Engine:
        return self.primary_read_engine.execution_options(isolation_level="AUTOCOMMIT")

    def dispose(self) -> None:
        self.engine.dispose()
        self.read_engine.dispose()
        self.primary_read_engine.dispose()
