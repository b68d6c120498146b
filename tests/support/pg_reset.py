"""Emptying a test session's PostgreSQL database between tests.

TRUNCATE swaps the files of every table and index: 170-210 ms on a 2-core machine whatever the
rows, paid by each of the thousand-odd PostgreSQL tests. Most tests leave a handful of rows, which
one DELETE of every table (a single statement, one round trip) removes in about 3 ms. It runs with
``session_replication_role = replica`` so that the append-only triggers (``run_event``) and the
foreign keys do not fire: the database is emptied as a whole, not row by row under the product's
rules. A DELETE leaves dead rows behind (the server's autovacuum may be off), so once the rows
deleted since the last TRUNCATE pass ``DEAD_ROWS_BEFORE_TRUNCATE``, the next reset truncates
instead: the tables never grow past a few thousand dead rows, and plans stay those of small
tables. A role that may not set ``session_replication_role`` (not a superuser) always truncates.
"""

from __future__ import annotations

import psycopg

from agentledger.core.schema import Base

# Every table of the models, children first (neither statement cares, but a reader may).
TABLES = tuple(table.name for table in reversed(Base.metadata.sorted_tables))
DEAD_ROWS_BEFORE_TRUNCATE = 5_000

_ANY_ROW = "SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM {table})" for table in TABLES)
_TRUNCATE = f"TRUNCATE {', '.join(TABLES)} CASCADE"
# Data-modifying CTEs: every DELETE runs on the same snapshot, in one statement.
_DELETE_ALL = ("WITH " + ", ".join(f"d{i} AS (DELETE FROM {table} RETURNING 1)"
                                   for i, table in enumerate(TABLES))
               + " SELECT " + " + ".join(f"(SELECT count(*) FROM d{i})"
                                         for i in range(len(TABLES))))


class _Resetter:
    def __init__(self, conninfo: str) -> None:
        self.conn = psycopg.connect(conninfo, autocommit=True)
        try:
            self.conn.execute("SET session_replication_role = replica")
            self.can_delete = True
        except psycopg.errors.InsufficientPrivilege:
            self.can_delete = False
        self.dead_rows = 0

    def empty(self) -> None:
        if not self.can_delete or self.dead_rows >= DEAD_ROWS_BEFORE_TRUNCATE:
            if self.conn.execute(_ANY_ROW).fetchone()[0]:
                self.conn.execute(_TRUNCATE)
            self.dead_rows = 0
            return
        self.dead_rows += self.conn.execute(_DELETE_ALL).fetchone()[0]


_RESETTERS: dict[str, _Resetter] = {}


def empty(conninfo: str) -> None:
    """Leave every table of the database at ``conninfo`` empty."""
    resetter = _RESETTERS.get(conninfo)
    if resetter is not None:
        try:
            resetter.empty()
            return
        except psycopg.OperationalError:  # a test ended the server's connections
            forget(conninfo)
    resetter = _RESETTERS[conninfo] = _Resetter(conninfo)
    resetter.empty()


def forget(conninfo: str) -> None:
    """Close the reset connection to a database about to be dropped."""
    resetter = _RESETTERS.pop(conninfo, None)
    if resetter is not None:
        resetter.conn.close()
