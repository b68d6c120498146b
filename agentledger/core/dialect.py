"""The few places where SQLite and PostgreSQL differ, in one module.

Upsert-or-ignore, row locks and skip-locked claims, the database clock, and notifications.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime

from sqlalchemy import Select, Table, func, null, text
from sqlalchemy.orm import Session

from agentledger.core import cacheable_upsert
from agentledger.core.database import PENDING_NOTIFICATIONS

EVENTS_CHANNEL = "agentledger_events"
QUEUE_CHANNEL = "agentledger_queue"


def name(session: Session) -> str:
    return session.get_bind().dialect.name


def insert_ignoring_conflicts(session: Session, table: Table, index_elements=None):
    """``INSERT … ON CONFLICT DO NOTHING`` for the session's dialect."""
    stmt = cacheable_upsert.insert(name(session), table)
    return stmt.on_conflict_do_nothing(index_elements=index_elements)


def increment_counter(session: Session, table: Table, keys: dict, column: str) -> int:
    """Insert the row with ``column = 1`` or add 1 to it, atomically; returns the new value."""
    stmt = _counter_statement(name(session), table, tuple(keys), column)
    return session.execute(stmt, {**keys, column: 1}).scalar_one()


@functools.cache
def _counter_statement(dialect_name: str, table: Table, keys: tuple[str, ...], column: str):
    # Built once per shape: it runs on every message post when rate limits are on.
    return (
        cacheable_upsert.insert(dialect_name, table)
        .on_conflict_do_update(index_elements=list(keys),
                               set_={column: getattr(table.c, column) + 1})
        .returning(getattr(table.c, column))
    )


def clock_column(dialect_name: str):
    """A select-list item that reads the clock in the same round trip as a query (PostgreSQL),
    or NULL (SQLite, whose clock is this process's). Pass its value to ``now(read=…)``."""
    return func.clock_timestamp() if dialect_name == "postgresql" else null()


def now(session: Session, *, read: datetime | None = None) -> datetime:
    """The database's clock at the moment of the call, which every lease comparison uses.

    On PostgreSQL it is the server's ``clock_timestamp()``, shared by every process on every
    machine. Not ``now()``: that is the transaction's *start*, and a transaction that waited
    for a row lock (or was descheduled) would stamp its work earlier than the commit it
    waited for: a run could "start" before the previous run of its thread finished. So each
    ingest operation reads the clock once, *after* taking the locks that order it, and stamps
    everything it writes with that one value. SQLite is embedded in this process, so its
    clock is this machine's, read after ``BEGIN IMMEDIATE`` for the same reason.

    A historical import sets ``session.info["clock"]`` to the moment being replayed; every
    ingest function then stamps rows with that moment instead (see ``ingest.history``).
    """
    override = session.info.get("clock")
    if override is not None:
        return override
    if read is not None:  # the clock, already read by a query of this operation
        return read.astimezone(UTC)
    if name(session) == "postgresql":
        value = session.execute(text("SELECT clock_timestamp()")).scalar_one()
        return value.astimezone(UTC)
    # Begin the transaction first: a writer's BEGIN IMMEDIATE waits for the write lock, and a
    # clock read before that wait would stamp this transaction earlier than the one it waited
    # for (a run could start before it was created).
    session.connection()
    return datetime.now(UTC)


def for_update(stmt: Select, session: Session, *, skip_locked: bool = False) -> Select:
    """Row locks on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already serialises writers."""
    if name(session) == "postgresql":
        return stmt.with_for_update(skip_locked=skip_locked)
    return stmt


def notify(session: Session, channel: str, payload: str) -> None:
    """Tell listeners, delivered when (and only if) the transaction commits.

    Other processes hear it through PostgreSQL's NOTIFY; this process's own listeners get it
    from ``Database.write`` after the commit (on SQLite that is the only fast path).
    """
    session.info.setdefault(PENDING_NOTIFICATIONS, []).append((channel, payload))
    if name(session) == "postgresql":
        session.execute(text("SELECT pg_notify(:c, :p)"), {"c": channel, "p": payload})


def upsert_adding(
    session: Session,
    table: Table,
    key_columns: list[str],
    rows: list[dict],
    *,
    least: tuple[str, ...] = (),
    greatest: tuple[str, ...] = (),
) -> None:
    """Insert ``rows``, or add their values to the rows that exist, in one statement.

    Every column that is neither a key nor named in ``least``/``greatest`` is a counter: on
    conflict it becomes ``existing + new``. ``least``/``greatest`` columns keep the smaller /
    larger of the two (NULL meaning "none yet"). All rows must have the same columns and
    distinct keys. The row lock the upsert takes serialises concurrent writers of one key.
    """
    if not rows:
        return
    stmt = _adding_statement(name(session), table, tuple(key_columns), tuple(rows[0]),
                             tuple(least), tuple(greatest))
    # executemany of one small statement: cheap to compile whatever the number of rows
    session.execute(stmt, rows)


@functools.lru_cache(maxsize=256)
def _adding_statement(dialect_name: str, table: Table, key_columns: tuple[str, ...],
                      columns: tuple[str, ...], least: tuple[str, ...],
                      greatest: tuple[str, ...]):
    # Built once per shape: ``excluded`` is an alias of every column of the table, and building
    # it for the wide rollup tables cost more than the upsert itself (it runs at every run end).
    stmt = cacheable_upsert.insert(dialect_name, table)
    new = stmt.excluded
    pick = func.least if dialect_name == "postgresql" else func.min
    keep = func.greatest if dialect_name == "postgresql" else func.max
    set_: dict = {}
    for column in columns:
        if column in key_columns:
            continue
        old = table.c[column]
        if column in least:
            set_[column] = pick(func.coalesce(old, new[column]), func.coalesce(new[column], old))
        elif column in greatest:
            set_[column] = keep(func.coalesce(old, new[column]), func.coalesce(new[column], old))
        else:
            set_[column] = old + new[column]
    return stmt.on_conflict_do_update(index_elements=list(key_columns), set_=set_)


def copy_rows(session: Session, table: str, columns: tuple[str, ...], rows) -> None:
    """``COPY table (columns) FROM STDIN`` on PostgreSQL, in the session's transaction: the
    fastest way in for many rows. Rows are tuples in ``columns`` order; JSON columns are
    given as JSON text (PostgreSQL parses it; nothing is serialised twice)."""
    raw = session.connection().connection.driver_connection  # the psycopg connection
    assert raw is not None
    with raw.cursor() as cursor, cursor.copy(
        f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    ) as copy:
        for row in rows:
            copy.write_row(row)
