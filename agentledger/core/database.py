"""Database lifecycle: engines, sessions and the per-dialect connection setup.

Two engines per process: a writer used only by ``ingest`` and the entry points that drive it,
and a reader used by ``queries`` whose connections refuse writes (``PRAGMA query_only`` on
SQLite, ``default_transaction_read_only`` on PostgreSQL). Entry points own the transaction:
``with db.write() as s: ingest.…(s, …)`` commits on success and rolls back on any error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session

from agentledger.core.config import sqlite_path
from agentledger.core.redaction import SESSION_KEY as REDACTOR_KEY
from agentledger.core.redaction import Redactor, install_log_redaction

READ_STATEMENT_TIMEOUT_MS = 30_000
PENDING_NOTIFICATIONS = "agentledger_pending_notifications"


def normalize_url(url: str) -> str:
    """Accept the URL forms people paste (``postgres://``, ``postgresql://``) and use psycopg 3."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


def _sqlite_engine(url: str, *, read_only: bool) -> Engine:
    path = sqlite_path(url)
    if path is None:
        raise SystemExit("agentledger needs a SQLite file (sqlite:///path), not an in-memory database")
    engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Take transaction control away from the sqlite3 module so that BEGIN is ours.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        if read_only:
            cursor.execute("PRAGMA query_only=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        # Writers take the write lock up front: no deadlock-prone lock upgrades, and the
        # transaction is the serialisation point that PostgreSQL gets from row locks.
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


def _postgres_engine(url: str, *, read_only: bool) -> Engine:
    options = "-c timezone=UTC"
    if read_only:
        options += (
            " -c default_transaction_read_only=on"
            f" -c statement_timeout={READ_STATEMENT_TIMEOUT_MS}"
        )
    return create_engine(
        url,
        pool_size=10,
        max_overflow=20,
        pool_pre_ping=True,
        connect_args={"options": options},
    )


class Database:
    """The engines of one process. Create once per process; call ``dispose`` on shutdown."""

    def __init__(self, url: str, read_url: str | None = None, *, redaction_rules: tuple = ()):
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
        self.read_engine = factory(self.read_url or self.url, read_only=True)
        # Reads that must see this process's own latest commit (read-after-write) go to the
        # primary even when a replica serves the other reads.
        self.primary_read_engine = (
            factory(self.url, read_only=True) if self.read_url else self.read_engine
        )
        self._listeners: list[Callable[[str, str], None]] = []

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
        with Session(self.engine, expire_on_commit=False, autoflush=False) as session:
            if self.redactor.active:
                session.info[REDACTOR_KEY] = self.redactor
            with session.begin():
                yield session
            pending = session.info.pop(PENDING_NOTIFICATIONS, ())
        for channel, payload in pending:
            for listener in self._listeners:
                listener(channel, payload)

    def add_notification_listener(self, listener: Callable[[str, str], None]) -> None:
        self._listeners.append(listener)

    @classmethod
    def from_settings(cls, settings) -> Database:
        rules = settings.redaction_rules()
        install_log_redaction(rules)
        return cls(settings.database_url, settings.read_database_url, redaction_rules=rules)

    @contextmanager
    def read(self, *, primary: bool = False) -> Iterator[Session]:
        """A read-only transaction (anything that tries to write fails in the database).

        On the replica when one is configured, unless ``primary`` asks for read-after-write.
        """
        engine = self.primary_read_engine if primary else self.read_engine
        with Session(engine, autoflush=False) as session:
            with session.begin():
                yield session

    @contextmanager
    def read_latest(self) -> Iterator[Session]:
        """Reads whose every statement sees the latest commits, with no snapshot across them.

        On PostgreSQL they run outside a transaction (autocommit): no BEGIN and COMMIT round
        trips. For loops that re-read small things often (an event stream after each
        notification); under READ COMMITTED a transaction would not give them one snapshot
        anyway.
        """
        if not self.is_postgres:
            with self.read() as session:
                yield session
            return
        with Session(self._autocommit_read_engine, autoflush=False) as session:
            yield session

    def read_row(self, stmt, params: dict | None = None):
        """The one row (or None) of a read that is a single statement.

        On PostgreSQL it runs outside any transaction (autocommit): one round trip instead of
        BEGIN, the query and COMMIT, for the reads every request makes (who is calling). A
        single statement sees one consistent snapshot by itself. SQLite is in this process, so
        a transaction costs nothing there.
        """
        if not self.is_postgres:
            with self.read() as session:
                return session.execute(stmt, params or {}).one_or_none()
        with self._autocommit_read_engine.connect() as connection:
            return connection.execute(stmt, params or {}).one_or_none()

    @functools.cached_property
    def _autocommit_read_engine(self) -> Engine:
        return self.read_engine.execution_options(isolation_level="AUTOCOMMIT")

    def dispose(self) -> None:
        self.engine.dispose()
        self.read_engine.dispose()
        self.primary_read_engine.dispose()
