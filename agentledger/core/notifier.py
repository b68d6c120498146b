"""Waking waiters in this process when any process appends events or queues a run.

One background thread per process watches the database for every waiter in it (streams, worker
loops), never one connection per client:

- PostgreSQL: a single ``LISTEN`` connection receives the ``NOTIFY`` sent by each commit.
- SQLite: a single read-only connection polls ``PRAGMA data_version`` (which changes when any
  other connection commits) every 50 ms; when it changes, one query over the watched runs'
  ``last_event_seq`` tells which of them moved.

Writes made by this very process are signalled straight after their commit
(``hear_commits_of``), and their echo through ``LISTEN`` is skipped (it comes from one of the
process's own server connections, ``Database.writes_through``): each commit wakes its waiters
once, not twice (a second stream page read, a second claim that finds nothing). A notification
is only a hint: waiters re-read the database, the source of truth, so a missed or duplicated
one can delay delivery by at most the fallback timeout, never lose or repeat data.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from sqlalchemy.engine import make_url

from agentledger.core.config import sqlite_path
from agentledger.core.dialect import CANCEL_CHANNEL, EVENTS_CHANNEL, QUEUE_CHANNEL

if TYPE_CHECKING:
    from agentledger.core.database import Database

log = logging.getLogger("agentledger.core.notifier")

SQLITE_WATCH_SECONDS = 0.05
FALLBACK_SECONDS = 1.0


@dataclass
class _Subscription:
    changed: threading.Condition
    generation: int = 0
    subscribers: int = 0


class EventNotifier:
    def __init__(self, database_url: str, *, is_postgres: bool, poll_seconds: float = 0.1):
        self._url = database_url
        self.is_postgres = is_postgres
        self.poll_seconds = poll_seconds
        self._lock = threading.RLock()
        # One condition per watched key (all on one lock): a notification wakes the waiters of
        # its run only. A single shared condition woke every stream of the process on every
        # event of any run, and that herd, not the database, bounded throughput.
        self._subscriptions: dict[str, _Subscription] = {}
        self._queue_generation = 0
        self._queue_changed = threading.Condition(self._lock)
        self._watching = False
        self._started = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._own_writes: list[Callable[[int], bool]] = []
        self._cancel_listeners: list[Callable[[str], None]] = []

    # ---- waiting -------------------------------------------------------------------------

    @property
    def fallback_timeout(self) -> float:
        """How long a waiter sleeps without a signal: a safety net while the watcher runs, a
        short poll when it cannot (database unreachable)."""
        return FALLBACK_SECONDS if self._watching else self.poll_seconds

    def subscribe(self, key: str) -> None:
        self.ensure_started()
        with self._lock:
            entry = self._subscriptions.get(key)
            if entry is None:
                entry = self._subscriptions[key] = _Subscription(threading.Condition(self._lock))
            entry.subscribers += 1

    def unsubscribe(self, key: str) -> None:
        with self._lock:
            entry = self._subscriptions.get(key)
            if entry is not None:
                entry.subscribers -= 1
                if entry.subscribers <= 0:
                    del self._subscriptions[key]

    def subscribers(self, key: str) -> int:
        """How many waiters are subscribed to ``key`` now."""
        with self._lock:
            entry = self._subscriptions.get(key)
            return entry.subscribers if entry else 0

    def generation(self, key: str) -> int:
        with self._lock:
            entry = self._subscriptions.get(key)
            return entry.generation if entry else 0

    def wait(self, key: str, seen: int, timeout: float) -> int:
        """Block until ``key`` changes after generation ``seen`` or ``timeout`` passes
        (the caller has subscribed to ``key``)."""
        deadline = time.monotonic() + max(0.0, min(timeout, self.fallback_timeout))
        with self._lock:
            entry = self._subscriptions.get(key)
            changed = entry.changed if entry else threading.Condition(self._lock)
            while self.generation(key) == seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                changed.wait(remaining)
            return self.generation(key)

    def queue_generation(self) -> int:
        self.ensure_started()
        with self._lock:
            return self._queue_generation

    def wait_for_queue(self, seen: int, timeout: float) -> int:
        deadline = time.monotonic() + max(0.0, min(timeout, self.fallback_timeout))
        with self._lock:
            while self._queue_generation == seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._queue_changed.wait(remaining)
            return self._queue_generation

    # ---- cancel requests -----------------------------------------------------------------

    def on_cancel(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(run_id)`` when a cancel request that made the run ``cancelling``
        commits, in any process on PostgreSQL, in this one on SQLite. A hint like every
        notification (one missed while the listener reconnects is not repeated), but never a
        false one: a run once ``cancelling`` stays so until it ends."""
        self.ensure_started()
        with self._lock:
            self._cancel_listeners.append(listener)

    def off_cancel(self, listener: Callable[[str], None]) -> None:
        with self._lock:
            if listener in self._cancel_listeners:
                self._cancel_listeners.remove(listener)

    # ---- signalling ----------------------------------------------------------------------

    def hear_commits_of(self, db: Database) -> None:
        """Be told of ``db``'s commits by ``db.write`` itself, at once, instead of by their
        echo through the database."""
        db.add_notification_listener(self.signal)
        self._own_writes.append(db.writes_through)

    def _is_echo(self, backend_pid: int) -> bool:
        return any(own(backend_pid) for own in self._own_writes)

    def signal(self, channel: str, payload: str) -> None:
        """Record a notification (from the watcher, or from this process's own commits)."""
        if channel == CANCEL_CHANNEL:
            with self._lock:
                listeners = list(self._cancel_listeners)
            for listener in listeners:  # outside the lock: they take their own
                listener(payload)
            return
        with self._lock:
            if channel == QUEUE_CHANNEL:
                self._queue_generation += 1
                self._queue_changed.notify_all()
                return
            entry = self._subscriptions.get(payload)
            if entry is not None:
                entry.generation += 1
                entry.changed.notify_all()

    def _wake_all(self) -> None:
        with self._lock:
            for entry in self._subscriptions.values():
                entry.generation += 1
                entry.changed.notify_all()
            self._queue_generation += 1
            self._queue_changed.notify_all()

    # ---- the watcher thread --------------------------------------------------------------

    def ensure_started(self) -> None:
        if self._started:
            return
        with self._lock:
            if self._started:
                return
            self._started = True
        target = self._listen_forever if self.is_postgres else self._watch_sqlite_forever
        self._thread = threading.Thread(target=target, name="agentledger-notify", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _retrying(self, body, what: str) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                body()
                backoff = 0.5
            except (psycopg.Error, sqlite3.Error) as exc:
                log.warning("%s lost its connection (%s); retrying", what, exc)
            finally:
                self._watching = False
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def _listen_forever(self) -> None:
        def listen() -> None:
            conninfo = make_url(self._url).set(drivername="postgresql").render_as_string(
                hide_password=False
            )
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                conn.execute(f"LISTEN {QUEUE_CHANNEL}")
                conn.execute(f"LISTEN {CANCEL_CHANNEL}")
                self._watching = True
                # Anything committed while we were not listening is picked up by a re-read.
                self._wake_all()
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=1.0):
                        if not self._is_echo(note.pid):
                            self.signal(note.channel, note.payload)

        self._retrying(listen, "notification listener")

    def _watch_sqlite_forever(self) -> None:
        path = sqlite_path(self._url)
        if path is None:
            return

        def watch() -> None:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5,
                                   check_same_thread=False, isolation_level=None)
            try:
                conn.execute("PRAGMA busy_timeout=5000")
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                seqs: dict[str, int] = {}
                self._watching = True
                self._wake_all()
                while not self._stop.wait(SQLITE_WATCH_SECONDS):
                    current = conn.execute("PRAGMA data_version").fetchone()[0]
                    if current == version:
                        continue
                    version = current
                    self._signal_changed_runs(conn, seqs)
            finally:
                conn.close()

        self._retrying(watch, "SQLite change watcher")

    def _signal_changed_runs(self, conn: sqlite3.Connection, seqs: dict[str, int]) -> None:
        with self._lock:
            watched = list(self._subscriptions)
        for stale in set(seqs) - set(watched):
            del seqs[stale]
        for start in range(0, len(watched), 500):
            chunk = watched[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for run_id, seq in conn.execute(
                f"SELECT id, last_event_seq FROM agent_run WHERE id IN ({marks})", chunk
            ):
                if seqs.get(run_id) != seq:
                    seqs[run_id] = seq
                    self.signal(EVENTS_CHANNEL, run_id)
        # Worker loops are few; any commit may have queued a run.
        self.signal(QUEUE_CHANNEL, "")
