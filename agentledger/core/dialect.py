"""The few places where SQLite and PostgreSQL differ, in one module.

Upsert-or-ignore, row locks and skip-locked claims, the database clock, and notifications.
"""

from __future__ import annotations

import contextlib
import functools
import io
import threading
import weakref
from datetime import UTC, datetime

import psycopg
from psycopg import sql
from psycopg.copy import FileWriter
from psycopg.types.json import set_json_dumps
from sqlalchemy import (
    Integer,
    Select,
    Table,
    bindparam,
    case,
    func,
    literal_column,
    null,
    select,
    text,
    type_coerce,
)
from sqlalchemy.orm import Session

from agentledger.core import cacheable_upsert
from agentledger.core.database import PENDING_NOTIFICATIONS
from agentledger.core.schema import UTCDateTime

EVENTS_CHANNEL = "agentledger_events"
QUEUE_CHANNEL = "agentledger_queue"
# A run became ``cancelling`` (payload: its id): its executor stops the agent at once instead
# of at its monitor's next look at the run.
CANCEL_CHANNEL = "agentledger_cancel"


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
    """Row locks on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already serialises writers.

    The lock is ``FOR NO KEY UPDATE`` (what an ``UPDATE`` that leaves the key alone takes), not
    ``FOR UPDATE``: no writer changes a row's key, and ``FOR UPDATE`` would also block the
    ``KEY SHARE`` lock a foreign-key check takes on the row a written row points at. A
    transaction that updates a child run twice checks its ``parent_run_id`` again on the second
    update (the row version is its own) and so asks for ``KEY SHARE`` on the parent, holding
    the child: under ``FOR UPDATE`` a cancel that held the parent and waited for the child was a
    deadlock."""
    if name(session) == "postgresql":
        return stmt.with_for_update(key_share=True, skip_locked=skip_locked)
    return stmt


def locked_with_clock(stmt: Select, dialect_name: str, *, skip_locked: bool = False,
                      order_by: tuple[str, ...] = ()) -> Select:
    """``stmt``'s rows, locked, with a ``now`` column to pass to ``now(read=…)``: one round
    trip for the locks and the clock an operation stamps its writes with.

    On PostgreSQL ``stmt`` becomes a ``MATERIALIZED`` CTE with ``FOR NO KEY UPDATE`` (see
    ``for_update``) and the outer select reads ``clock_timestamp()`` only once the CTE has
    returned a locked row, so the time is read after any wait for the lock, as ``now``
    requires. ``order_by`` names columns
    of ``stmt`` to order the outer select by (a CTE's order is not kept). On SQLite, whose
    write lock is already held and whose clock is this process's, ``now`` is NULL.
    """
    if dialect_name != "postgresql":
        return stmt.add_columns(null().label("now"))
    locked = (stmt.with_for_update(key_share=True, skip_locked=skip_locked)
              .cte("locked").prefix_with("MATERIALIZED"))
    return (select(*locked.c, type_coerce(clock_column(dialect_name), UTCDateTime).label("now"))
            .order_by(*(locked.c[c] for c in order_by)))


_NOTIFY = text("SELECT pg_notify(:c, :p)")


def notify(session: Session, channel: str, payload: str) -> None:
    """Tell listeners, delivered when (and only if) the transaction commits.

    Other processes hear it through PostgreSQL's NOTIFY; this process's own listeners get it
    from ``Database.write`` after the commit (on SQLite that is the only fast path).
    """
    notified(session, channel, payload)
    if name(session) == "postgresql":
        session.execute(_NOTIFY, {"c": channel, "p": payload})


def notified(session: Session, channel: str, payload: str) -> None:
    """A statement of this transaction sent ``pg_notify(channel, payload)`` itself (one round
    trip fewer): this process's own listeners still get it after the commit."""
    session.info.setdefault(PENDING_NOTIFICATIONS, []).append((channel, payload))


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
    upsert_adding_together(session, [(table, key_columns, rows)], least=least, greatest=greatest)


# Pipeline mode needs libpq 14 or newer (psycopg's binary package ships one); with an older
# system libpq the statements go one round trip each.
_PIPELINES = psycopg.Pipeline.is_supported()


def upsert_adding_together(
    session: Session,
    parts: list[tuple[Table, list[str], list[dict]]],
    *,
    least: tuple[str, ...] = (),
    greatest: tuple[str, ...] = (),
) -> None:
    """``upsert_adding`` of several tables (``(table, key_columns, rows)`` each, in that order),
    sent to PostgreSQL in one round trip: a pipeline, so a run's ending adds to its three
    outcome rollups without waiting for each in turn."""
    parts = [part for part in parts if part[2]]
    if not parts:
        return
    if name(session) == "postgresql":
        # The statement is ~14 kB with ~150 parameters: psycopg re-parses a query that long on
        # every execution (it caches only short ones), which was most of a run end's CPU. Sent
        # already in PostgreSQL's $n form through a raw cursor, nothing is parsed client-side.
        # The values bypass SQLAlchemy's bind processing: these columns are numbers, text,
        # dates and aware datetimes, which psycopg adapts exactly as SQLAlchemy would pass them.
        connection = _driver_connection(session)
        together = len(parts) > 1 and _PIPELINES
        with connection.pipeline() if together else contextlib.nullcontext(), \
                psycopg.RawCursor(connection) as cursor:
            for table, key_columns, rows in parts:
                statement, order = _raw_adding_statement(
                    table, tuple(rows[0]), tuple(key_columns), least, greatest)
                params = [tuple(row[column] for column in order) for row in rows]
                if len(params) == 1:
                    cursor.execute(statement, params[0])
                else:
                    cursor.executemany(statement, params)
        return
    for table, key_columns, rows in parts:
        # executemany of one small statement: cheap to compile whatever the number of rows
        session.execute(_adding_statement(name(session), table, tuple(rows[0]),
                                          tuple(key_columns), least, greatest), rows)


def upsert_adding_one(
    session: Session,
    parts: list[tuple[Table, list[str], dict]],
    *,
    one_hot: tuple[tuple[str, tuple[str, ...]], ...],
    least: tuple[str, ...] = (),
    greatest: tuple[str, ...] = (),
) -> None:
    """``upsert_adding_together`` of one row per table, with each group of ``one_hot``
    columns given by one value: ``(name, columns)`` means the row has a ``name`` value (an
    index into ``columns``, or None), and ``columns[name]`` counts 1, the others 0.

    For a single ended run, whose latency and wait each fall in one histogram bucket: the
    database writes the zeros, so a row of ~150 columns travels as ~20 values. On PostgreSQL
    the tables' upserts are one statement, whose parameters are shared by name: a name the
    rows share must have one value (client CPU per run end, measured in one process: about
    500 µs as a pipeline of full rows, 300 as a pipeline of these, 150 as one statement)."""
    shapes = tuple((table, tuple(row), tuple(key_columns)) for table, key_columns, row in parts)
    if name(session) == "postgresql":
        statement, order = _raw_one_hot_chain(shapes, one_hot, least, greatest)
        values: dict = {}
        for _table, _key_columns, row in parts:
            for column, value in row.items():
                if values.setdefault(column, value) != value:
                    raise ValueError(f"{column}: the rows of one statement give it two values")
        with psycopg.RawCursor(_driver_connection(session)) as cursor:
            # Prepared at once (psycopg would parse and plan it five times per connection
            # first): planning this statement costs about as much as running it.
            cursor.execute(statement, tuple(values[column] for column in order), prepare=True)
        return
    for (table, columns, key_columns), (_t, _k, row) in zip(shapes, parts, strict=True):
        session.execute(_one_hot_statement(name(session), table, columns, key_columns,
                                           one_hot, least, greatest), row)


@functools.lru_cache(maxsize=16)
def _raw_one_hot_chain(shapes: tuple[tuple[Table, tuple[str, ...], tuple[str, ...]], ...],
                       one_hot: tuple[tuple[str, tuple[str, ...]], ...],
                       least: tuple[str, ...], greatest: tuple[str, ...]
                       ) -> tuple[bytes, tuple[str, ...]]:
    """The upserts of ``shapes`` as one PostgreSQL statement, in ``$n`` form with the value
    name of each ``$n`` (a name used by several tables or columns is one parameter).

    Each upsert after the first is an ``INSERT … SELECT`` from the ``RETURNING`` of the one
    before it (a CTE), so the tables' rows are locked in the order given, as the separate
    statements locked them: concurrent run endings and imports keep one lock order."""
    previous = None
    stmt = None
    for i, (table, columns, key_columns) in enumerate(shapes):
        values = _one_hot_values(table, columns, one_hot)
        base = _adding_statement("postgresql", table, tuple(values), key_columns, least, greatest)
        if previous is None:
            stmt = base.values(values)
        else:
            stmt = base.from_select(list(values), select(
                *(expr.label(column) for column, expr in values.items())).select_from(previous))
        previous = stmt.returning(literal_column("1")).cte(f"added_{i}")
    assert stmt is not None
    return _dollar_form(stmt)


def _one_hot_values(table: Table, columns: tuple[str, ...],
                    one_hot: tuple[tuple[str, tuple[str, ...]], ...]) -> dict:
    """The inserted value of each column: its typed parameter, or for a one-hot column
    ``CASE WHEN index = i THEN 1 ELSE 0 END`` (literals in the text: one parameter per group)."""
    hot_names = {hot for hot, _ in one_hot}
    values: dict = {column: bindparam(column, type_=table.c[column].type)
                    for column in columns if column not in hot_names}
    for hot, hot_columns in one_hot:
        index = bindparam(hot, type_=Integer)
        for i, column in enumerate(hot_columns):
            values[column] = case((index == literal_column(str(i)), literal_column("1")),
                                  else_=literal_column("0"))
    return values


@functools.lru_cache(maxsize=16)
def _one_hot_statement(dialect_name: str, table: Table, columns: tuple[str, ...],
                       key_columns: tuple[str, ...],
                       one_hot: tuple[tuple[str, tuple[str, ...]], ...],
                       least: tuple[str, ...], greatest: tuple[str, ...]):
    values = _one_hot_values(table, columns, one_hot)
    return _adding_statement(dialect_name, table, tuple(values), key_columns, least,
                             greatest).values(values)


@functools.lru_cache(maxsize=64)
def _raw_adding_statement(table: Table, columns: tuple[str, ...], key_columns: tuple[str, ...],
                          least: tuple[str, ...], greatest: tuple[str, ...]
                          ) -> tuple[bytes, tuple[str, ...]]:
    """The PostgreSQL upsert as text with ``$n`` parameters, and the column of each ``$n``."""
    stmt = _adding_statement("postgresql", table, columns, key_columns, least, greatest)
    return _dollar_form(stmt, column_keys=list(columns))


def _dollar_form(stmt, *, column_keys: list[str] | None = None) -> tuple[bytes, tuple[str, ...]]:
    """``stmt`` compiled for PostgreSQL in ``$n`` form (what a psycopg ``RawCursor`` sends
    unparsed), and the parameter name of each ``$n``."""
    from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect

    compiled = stmt.compile(dialect=psycopg_dialect.dialect(paramstyle="numeric_dollar"),
                            column_keys=column_keys)
    assert compiled.positiontup is not None
    return str(compiled).encode(), tuple(compiled.positiontup)


@functools.lru_cache(maxsize=64)
def _adding_statement(dialect_name: str, table: Table, columns: tuple[str, ...],
                      key_columns: tuple[str, ...], least: tuple[str, ...],
                      greatest: tuple[str, ...]):
    # Built once per shape (callers keep to a few): a wide table's ``excluded`` collection
    # alone took ~10 ms of CPU to build, on every run end for the outcome rollups.
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
    given as JSON text (nothing is serialised twice)."""
    # Formatted first, then sent: the column types are read before the COPY holds the
    # connection (during a COPY it serves nothing else), and the rows are formatted in one place.
    copy_data(session, table, columns, copy_bytes(session, table, columns, rows))


def copy_bytes(session: Session, table: str, columns: tuple[str, ...], rows) -> bytes:
    """Rows as ``COPY … FROM STDIN`` data, formatted by psycopg's own adapters without being
    sent: a batch prepared in another process travels as one bytes object (far cheaper to
    pickle than its rows) and goes in with ``copy_data``. Rows as for ``copy_rows``."""
    connection = _driver_connection(session)
    oids = _column_types(connection, table, columns)
    buffer = io.BytesIO()
    with connection.cursor() as cursor, \
            psycopg.Copy(cursor, binary=True, writer=FileWriter(buffer)) as copy:
        _binary_columns(copy, cursor, oids)
        for row in rows:
            copy.write_row(row)
    return buffer.getvalue()


def copy_data(session: Session, table: str, columns: tuple[str, ...], data: bytes) -> None:
    """``COPY table (columns) FROM STDIN`` of data made by ``copy_bytes``, in the session's
    transaction."""
    with _driver_connection(session).cursor() as cursor, \
            cursor.copy(_copy_from_stdin(table, columns)) as copy:
        copy.write(data)


# COPY goes in PostgreSQL's binary format: against the text format it takes about half the
# formatter's CPU and three quarters of the server's per row (a timestamp is 8 bytes instead
# of text to parse, JSON needs no escaping; measured in docs/design.md, "Scale"). The format
# needs each column's exact type; they are read from the database's catalog, never spelled out
# here, so the migrated schema stays their one home. Read once per connection and table: a
# pooled connection keeps its database.
_COLUMN_TYPES: weakref.WeakKeyDictionary[psycopg.Connection, dict] = weakref.WeakKeyDictionary()
_COLUMN_TYPES_LOCK = threading.Lock()


def _column_types(connection: psycopg.Connection, table: str,
                  columns: tuple[str, ...]) -> list[int]:
    with _COLUMN_TYPES_LOCK:
        known = _COLUMN_TYPES.setdefault(connection, {})
    oids = known.get((table, columns))
    if oids is None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT a.atttypid::int FROM unnest(%s::text[]) WITH ORDINALITY AS c(name, i)"
                " LEFT JOIN pg_attribute a ON a.attrelid = %s::regclass AND a.attname = c.name"
                " AND NOT a.attisdropped ORDER BY c.i", (list(columns), table))
            oids = [oid for (oid,) in cursor.fetchall()]
        if None in oids:
            missing = [c for c, oid in zip(columns, oids, strict=True) if oid is None]
            raise LookupError(f"table {table} has no column {', '.join(missing)}")
        known[(table, columns)] = oids
    return oids


def _binary_columns(copy: psycopg.Copy, cursor: psycopg.Cursor, oids: list[int]) -> None:
    """Binary rows of these column types; JSON columns take JSON text as it is (psycopg's own
    jsonb dumper adds the format's version byte)."""
    set_json_dumps(_json_text, cursor)
    copy.set_types(oids)


def _json_text(text_: str) -> str:
    return text_


def _copy_from_stdin(table: str, columns: tuple[str, ...]) -> sql.Composed:
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)))


def _driver_connection(session: Session) -> psycopg.Connection:
    raw = session.connection().connection.driver_connection  # the psycopg connection
    assert raw is not None
    return raw
