"""One-row reads on PostgreSQL straight through psycopg, for the read every request makes.

The principal look-up runs on every authenticated request. Through SQLAlchemy's Core
connection it costs about 200 µs of CPU, half of it SQLAlchemy's own work around a statement
that has nothing for SQLAlchemy to do (no bind or result conversion, one row); on a pooled
connection's psycopg driver, in autocommit, it costs about 100 µs (both measured in one
process on the same database). A statement is compiled once, for the engine's dialect; one
that needs SQLAlchemy's conversions (a bind or result processor, such as ``UTCDateTime``)
is refused here (``DriverRead.of`` returns None) and the caller runs it the usual way.

The connection comes from the engine's pool, so its checkout checks (the ping after idle)
apply; a connection the failure broke is invalidated, and the error is raised as SQLAlchemy's
``DBAPIError``, as a statement run through SQLAlchemy would raise it.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import psycopg
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

MAX_STATEMENTS = 256


class DriverRead:
    """A compiled single-statement read: its SQL for psycopg, its bind names, its row type."""

    __slots__ = ("compiled", "sql", "row_type")

    # Keyed by the statement object itself (a module-level constant for the reads that use
    # this): its entry keeps it alive, so it is compiled once per dialect.
    _cache: dict[tuple[Any, Any], DriverRead | None] = {}
    _lock = threading.Lock()

    def __init__(self, compiled, row_type):
        self.compiled = compiled
        self.sql = compiled.string
        self.row_type = row_type

    @classmethod
    def of(cls, stmt, engine: Engine) -> DriverRead | None:
        """The compiled read of ``stmt`` (built once per statement object and dialect), or None
        when the statement needs SQLAlchemy to convert a parameter or a column."""
        key = (stmt, engine.dialect)
        try:
            return cls._cache[key]
        except KeyError:
            pass
        with cls._lock:
            if len(cls._cache) >= MAX_STATEMENTS:
                return None  # statements built per call: not worth compiling for the driver
            if key not in cls._cache:
                cls._cache[key] = cls._compile(stmt, engine)
            return cls._cache[key]

    @classmethod
    def _compile(cls, stmt, engine: Engine) -> DriverRead | None:
        dialect = engine.dialect
        compiled = stmt.compile(dialect=dialect)
        if any(b.type._cached_bind_processor(dialect) is not None
               for b in compiled.binds.values()):
            return None
        columns = getattr(compiled, "_result_columns", None) or []
        if not columns or any(c[3]._cached_result_processor(dialect, None) is not None
                              for c in columns):
            return None
        names = [c[0] for c in columns]
        return cls(compiled, collections.namedtuple("DriverRow", names, rename=True))

    def one_or_none(self, engine: Engine, params: dict | None):
        """The statement's single row (a named tuple) or None, outside a transaction."""
        values = self.compiled.construct_params(params or {})
        fairy = engine.raw_connection()
        try:
            driver = fairy.driver_connection
            driver.autocommit = True
            try:
                row = driver.execute(self.sql, values).fetchone()
            finally:
                if not driver.broken:
                    driver.autocommit = False
        except psycopg.Error as exc:
            if driver.broken:
                fairy.invalidate(exc)
            raise DBAPIError.instance(self.sql, values, exc, psycopg.Error,
                                      connection_invalidated=driver.broken) from exc
        finally:
            fairy.close()
        return None if row is None else self.row_type(*row)
