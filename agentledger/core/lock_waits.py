"""Saying so when a migration waits on PostgreSQL for a lock someone else holds.

``agentledger db upgrade`` (and ``serve``, ``worker``, ``app.py``, which migrate at start) waits
for the migrations' advisory lock (another process migrating) and for the table locks a
migration's DDL takes: a session left idle in a transaction on ``run_event`` holds one for as
long as it stays open. Without a word the command looks hung. A watcher on a connection of its
own asks PostgreSQL who blocks the migration's backend (``pg_blocking_pids``) and, once the wait
has lasted ``NOTICE_AFTER_SECONDS``, prints one line per blocking session to stderr: its pid,
application, state and how long its transaction has been open, so an operator can end it
(``pg_terminate_backend``) or wait. Nothing is cancelled here: the migration goes on once the
lock is released.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from sqlalchemy import text

NOTICE_AFTER_SECONDS = 5.0
POLL_SECONDS = 1.0

_BLOCKERS = text("""
    SELECT pid, coalesce(nullif(application_name, ''), 'unnamed') AS application, state,
           extract(epoch FROM now() - xact_start)::int AS open_seconds
    FROM pg_stat_activity WHERE pid = ANY(pg_blocking_pids(:pid)) ORDER BY pid
""")


def _notice(row) -> str:
    held = f", its transaction open {row.open_seconds} s" if row.open_seconds is not None else ""
    return (f"agentledger: the migration waits for a lock held by PostgreSQL session {row.pid} "
            f"({row.application}, {row.state or 'state unknown'}{held}); it goes on once that "
            f"session commits or ends (SELECT pg_terminate_backend({row.pid}) ends it)")


class _Watch:
    def __init__(self, url: str, pid: int, out: TextIO) -> None:
        self.url, self.pid, self.out = url, pid, out
        self.stopped = threading.Event()
        self.told: set[int] = set()
        self.thread = threading.Thread(target=self._run, name="migration-lock-watch",
                                       daemon=True)

    def _run(self) -> None:
        from agentledger.core.database import one_off_connection

        # Most migrations end before the notice is due: no connection is opened for them.
        if self.stopped.wait(NOTICE_AFTER_SECONDS):
            return
        try:
            with one_off_connection(self.url) as connection:
                while not self.stopped.is_set():
                    for row in connection.execute(_BLOCKERS, {"pid": self.pid}):
                        if row.pid not in self.told:
                            self.told.add(row.pid)
                            print(_notice(row), file=self.out, flush=True)
                    connection.rollback()  # each look on a fresh snapshot
                    self.stopped.wait(POLL_SECONDS)
        except Exception:  # a watcher that cannot watch must not stop the migration
            return


@contextmanager
def lock_waits_told(connection, url: str, *, out: TextIO | None = None) -> Iterator[None]:
    """Around a migration on ``connection``: on PostgreSQL, one line on ``out`` (stderr) per
    session that keeps it waiting for a lock past ``NOTICE_AFTER_SECONDS``."""
    if connection.dialect.name != "postgresql":
        yield
        return
    pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    watch = _Watch(url, pid, out if out is not None else sys.stderr)
    watch.thread.start()
    try:
        yield
    finally:
        watch.stopped.set()
        watch.thread.join(timeout=5)
