"""SQLite write transactions of one process take turns on a lock of their own.

SQLite has one writer at a time per database file. A writer that finds the file locked is made
to wait by sqlite3's busy handler, which does not wait for the lock to be released: it sleeps
and tries again, its sleeps growing to 100 ms (1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100,
100, … ms until ``busy_timeout``). Under load the lock is then often free while every waiter is
still asleep: at 50 concurrent trivial runs on one ``serve`` process the write lock sat idle
between writers, and the process did 76–79 runs/s. Writers of the same process wait here
instead, before their ``BEGIN IMMEDIATE``, and the next one starts as soon as the last one ends
(91–96 runs/s on the same machine; the workload of ``python -m bench.sqlite_peer``, see
``docs/design.md``).

Other processes writing the same file (a standalone worker, the CLI) still meet the busy
handler, as before. A turn not granted within ``BUSY_TIMEOUT_SECONDS`` (the engines' busy
timeout too) is not an error here: the transaction goes on to ``BEGIN IMMEDIATE`` and SQLite's own wait and
"database is locked" apply, so a stuck writer in this process fails the others as it did.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# How long a writer waits for the file: for its turn here, then in SQLite's busy handler (the
# SQLite engines' ``timeout``).
BUSY_TIMEOUT_SECONDS = 30.0

_turns: dict[str, threading.Lock] = {}
_turns_guard = threading.Lock()


def writer_turns(path: str) -> threading.Lock:
    """The lock of the SQLite file at ``path``, shared by every engine of this process on it."""
    key = os.path.realpath(path)
    with _turns_guard:
        return _turns.setdefault(key, threading.Lock())


@contextmanager
def writer_turn(turns: threading.Lock) -> Iterator[None]:
    """This thread's turn to write, for as long as the block runs (its commit included)."""
    granted = turns.acquire(timeout=BUSY_TIMEOUT_SECONDS)
    try:
        yield
    finally:
        if granted:
            turns.release()
