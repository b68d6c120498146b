"""Hot statements on PostgreSQL straight through psycopg, for what every request makes.

The principal look-up runs on every authenticated request, the run's locked row on every
append, cancel and delegation, an event stream's next page after every notification, and the
head advance on every append. Through SQLAlchemy's Core connection such a statement costs about
twice the CPU it costs on the connection's psycopg driver (principal look-up: ≈ 200 µs against
≈ 100 µs, measured in one process on the same database); what SQLAlchemy adds around a statement
compiled once is per-execution bookkeeping (execution context, result metadata, events). Here a
statement is compiled once per dialect (a write once per set of parameter names, which decides
its ``SET`` or ``VALUES`` columns); its result columns are converted with the same result
processors SQLAlchemy would apply (``UTCDateTime``'s). A statement with a numeric result column
(whose conversion SQLAlchemy chooses by the type the server reports for each result) is refused
(``of`` returns None) and the caller runs it the usual way, as is one whose SQL SQLAlchemy
completes at each execution (an ``in_`` of a list).

Reads (``DriverRead``) and writes (``DriverWrite``) apply each parameter's bind processor as
SQLAlchemy's execution would (a JSON document is serialized and wrapped for psycopg, a
``UTCDateTime`` checked and made UTC, an array's items made a list), so the driver is sent the
same values.

``one_or_none`` and ``all`` read outside a transaction on a connection of an engine's pool (the
pool's checkout checks, such as the ping after idle, apply); ``one_or_none_in``, ``all_in`` and
``DriverWrite.execute_in`` run inside a session's transaction, on its connection;
``one_or_none_on`` and ``DriverWrite.execute_on`` on an ``AutocommitConnection``, where each
statement commits alone. A connection a
failure broke is invalidated, and the error is raised as SQLAlchemy's ``DBAPIError`` (its
``IntegrityError`` and the rest), as a statement run through SQLAlchemy would raise it.
SQLAlchemy's cursor events do not see these statements.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import psycopg
from sqlalchemy import literal
from sqlalchemy import types as sqltypes
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, MultipleResultsFound, NoResultFound
from sqlalchemy.orm import Session

MAX_STATEMENTS = 256


def one_of(column, values: Iterable[Any]):
    """``column IN (…)`` with one bound value per item, so that the statement's SQL is fixed.
    An ``in_`` of a plain list is expanded into the SQL at each execution, which keeps the
    statement off the driver (``DriverRead.of`` refuses it) and costs that rendering each time."""
    return column.in_([literal(value, type_=column.type) for value in values])


class _DriverStatement:
    """A compiled statement for psycopg: its SQL, its result columns' converters, its row type."""

    __slots__ = ("compiled", "sql", "row_type", "converters", "processors")

    # Keyed by the statement object itself (module-level constants for the statements that use
    # this; its entry keeps it alive) and by the dialect's kind and server version, not the
    # dialect object: every engine has its own, and a process that makes many engines (tests,
    # tools) must not fill the cache with copies of one compilation. Each kind has its own.
    _cache: dict[tuple[Any, ...], Any]
    _lock: threading.Lock

    def __init__(self, compiled, row_type, converters: tuple[tuple[int, Callable], ...],
                 processors: tuple[tuple[str, Callable], ...] = ()):
        self.compiled = compiled
        self.sql = compiled.string
        self.row_type = row_type
        self.converters = converters
        self.processors = processors

    @classmethod
    def _cached(cls, key: tuple[Any, ...], compile_: Callable[[], Any]):
        try:
            return cls._cache[key]
        except KeyError:
            pass
        with cls._lock:
            if len(cls._cache) >= MAX_STATEMENTS:
                return None  # statements built per call: not worth compiling for the driver
            if key not in cls._cache:
                cls._cache[key] = compile_()
            return cls._cache[key]

    @staticmethod
    def _result_of(compiled, dialect):
        """(row type, converters) of the result columns; None when one is numeric."""
        columns = getattr(compiled, "_result_columns", None) or []
        if any(isinstance(c[3], sqltypes.Numeric) for c in columns):
            return None  # its conversion depends on the type the server reports per result
        converters = tuple(
            (i, process) for i, c in enumerate(columns)
            if (process := c[3]._cached_result_processor(dialect, None)) is not None
        )
        names = [c[0] for c in columns] or ["_"]
        return collections.namedtuple("DriverRow", names, rename=True), converters

    @staticmethod
    def _processors_of(compiled, dialect) -> tuple[tuple[str, Callable], ...]:
        """Each parameter's bind processor, as SQLAlchemy's execution applies them (a JSON
        document serialized and wrapped for psycopg, a ``UTCDateTime`` checked and made UTC,
        an array's items listed)."""
        return tuple(
            (compiled.bind_names[bind], process) for bind in compiled.binds.values()
            if (process := bind.type._cached_bind_processor(dialect)) is not None
        )

    def _values(self, params: dict | None) -> dict:
        values = self.compiled.construct_params(params or {})
        for name, process in self.processors:
            values[name] = process(values[name])
        return values

    def _row(self, found):
        if found is None:
            return None
        if self.converters:
            found = list(found)
            for i, process in self.converters:
                found[i] = process(found[i])
        return self.row_type(*found)

    def _in_transaction(self, session: Session, values: dict, fetch):
        """``fetch(cursor)`` of the statement run with ``values`` in ``session``'s transaction."""
        fairy = session.connection().connection
        driver = _psycopg(fairy)
        try:
            return fetch(driver.execute(self.sql, values))
        except psycopg.Error as exc:
            raise self._failed(fairy, driver, values, exc) from exc

    def _failed(self, fairy, driver: psycopg.Connection, values: dict,
                exc: psycopg.Error) -> Exception:
        if driver.broken:
            fairy.invalidate(exc)
        return DBAPIError.instance(self.sql, values, exc, psycopg.Error,
                                   connection_invalidated=driver.broken)


class DriverRead(_DriverStatement):
    """A compiled read."""

    __slots__ = ()
    _cache: dict[tuple[Any, ...], DriverRead | None] = {}
    _lock = threading.Lock()

    @classmethod
    def of(cls, stmt, engine_or_dialect) -> DriverRead | None:
        """The compiled read of ``stmt`` (built once per statement object and dialect), or None
        when its SQL is completed at each execution, the result has no typed columns (or a
        numeric one), or the engine has not connected yet."""
        dialect = getattr(engine_or_dialect, "dialect", engine_or_dialect)
        if dialect.server_version_info is None:
            return None  # not connected yet: compile once the dialect knows its server
        return cls._cached((stmt, type(dialect), dialect.server_version_info),
                           lambda: cls._compile(stmt, dialect))

    @classmethod
    def _compile(cls, stmt, dialect) -> DriverRead | None:
        compiled = stmt.compile(dialect=dialect)
        if compiled.post_compile_params or compiled.literal_execute_params:
            return None  # expanded into the SQL at each execution (``in_`` of a list)
        if not getattr(compiled, "_result_columns", None):
            return None
        result = cls._result_of(compiled, dialect)
        return None if result is None else cls(compiled, *result,
                                               cls._processors_of(compiled, dialect))

    def one_or_none(self, engine: Engine, params: dict | None):
        """The statement's single row (a named tuple) or None, outside a transaction."""
        return self._row(self._outside_transaction(engine, params, psycopg.Cursor.fetchone))

    def all(self, engine: Engine, params: dict | None) -> list:
        """Every row of the statement (named tuples), outside a transaction."""
        return [self._row(found)
                for found in self._outside_transaction(engine, params, psycopg.Cursor.fetchall)]

    def _outside_transaction(self, engine: Engine, params: dict | None, fetch):
        with AutocommitConnection(engine) as connection:
            return connection.run(self, self._values(params), fetch)

    def one_or_none_on(self, connection: AutocommitConnection, params: dict | None):
        """The statement's single row (a named tuple) or None, on ``connection``."""
        return self._row(connection.run(self, self._values(params),
                                        psycopg.Cursor.fetchone))

    def one_or_none_in(self, session: Session, params: dict | None):
        """The statement's single row (a named tuple) or None, in ``session``'s transaction."""
        return self._row(self._in_transaction(session, self._values(params),
                                              psycopg.Cursor.fetchone))

    def all_in(self, session: Session, params: dict | None) -> list:
        """Every row of the statement (named tuples), in ``session``'s transaction."""
        return [self._row(found)
                for found in self._in_transaction(
                    session, self._values(params), psycopg.Cursor.fetchall)]


class WriteResult(Protocol):
    """What a write answers, through the driver (``DriverResult``) or through SQLAlchemy (its
    ``CursorResult``): the callers of ``database.execute_write`` use only this."""

    rowcount: int

    def one(self) -> Any: ...

    def first(self) -> Any: ...

    def all(self) -> Any: ...

    def close(self) -> None: ...


class DriverResult:
    """What a ``DriverWrite`` answered: the rows it returned (converted) and its row count."""

    __slots__ = ("rowcount", "_rows")

    def __init__(self, rowcount: int, rows: list):
        self.rowcount = rowcount
        self._rows = rows

    def one(self):
        if len(self._rows) != 1:
            raise NoResultFound("no row") if not self._rows else MultipleResultsFound("rows")
        return self._rows[0]

    def first(self):
        return self._rows[0] if self._rows else None

    def all(self) -> list:
        return list(self._rows)

    def close(self) -> None:
        """Nothing to release: the rows were fetched with the statement."""


class DriverWrite(_DriverStatement):
    """A compiled write (an ``INSERT`` or ``UPDATE``, ``RETURNING`` rows or not) for one set of
    parameter names, with the bind processors SQLAlchemy would apply to them."""

    __slots__ = ()
    _cache: dict[tuple[Any, ...], DriverWrite | None] = {}
    _lock = threading.Lock()

    @classmethod
    def of(cls, stmt, dialect, names: Iterable[str]) -> DriverWrite | None:
        """The compiled write of ``stmt`` executed with parameters named ``names`` (built once
        per statement object, names and dialect), or None as for ``DriverRead.of``."""
        if dialect.server_version_info is None:
            return None
        keys = tuple(sorted(names))
        return cls._cached((stmt, keys, type(dialect), dialect.server_version_info),
                           lambda: cls._compile(stmt, dialect, keys))

    @classmethod
    def _compile(cls, stmt, dialect, keys: tuple[str, ...]) -> DriverWrite | None:
        # The parameter names decide the columns an INSERT or UPDATE without explicit values
        # sets, as they do when SQLAlchemy executes it.
        compiled = stmt.compile(dialect=dialect, column_keys=list(keys))
        if compiled.post_compile_params or compiled.literal_execute_params:
            return None
        result = cls._result_of(compiled, dialect)
        if result is None:
            return None
        return cls(compiled, *result, cls._processors_of(compiled, dialect))

    def execute_in(self, session: Session, params: dict) -> DriverResult:
        """Run the statement in ``session``'s transaction."""
        return self._result(self._in_transaction(session, self._values(params), _count_and_rows))

    def execute_on(self, connection: AutocommitConnection, params: dict) -> DriverResult:
        """Run the statement on ``connection``: a transaction of its own, committed when this
        returns."""
        return self._result(connection.run(self, self._values(params), _count_and_rows))

    def _result(self, counted: tuple[int, list]) -> DriverResult:
        rowcount, rows = counted
        return DriverResult(rowcount, [self._row(found) for found in rows])


class AutocommitConnection:
    """A connection of an engine's pool on which every statement is a transaction of its own
    (psycopg's autocommit): for an operation whose only write is one statement, which needs no
    ``BEGIN`` and ``COMMIT`` round trips around it. A context manager: the connection goes back
    to the pool, out of autocommit, when the block ends."""

    __slots__ = ("_fairy", "_driver")

    def __init__(self, engine: Engine):
        self._fairy = engine.raw_connection()
        try:
            self._driver = _psycopg(self._fairy)
            self._driver.autocommit = True
        except BaseException:
            self._fairy.close()
            raise

    def __enter__(self) -> AutocommitConnection:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if not self._driver.broken:
                self._driver.autocommit = False
        finally:
            self._fairy.close()

    def run(self, statement: _DriverStatement, values: dict, fetch):
        """``fetch(cursor)`` of ``statement`` run with ``values``."""
        try:
            return fetch(self._driver.execute(statement.sql, values))
        except psycopg.Error as exc:
            raise statement._failed(self._fairy, self._driver, values, exc) from exc


def _count_and_rows(cursor: psycopg.Cursor) -> tuple[int, list]:
    return cursor.rowcount, cursor.fetchall() if cursor.description is not None else []


def _psycopg(fairy) -> psycopg.Connection:
    driver = fairy.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise TypeError("core.driver_statements runs on psycopg connections only")
    return driver
