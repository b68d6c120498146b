"""Waking waiters in this process when another process appends events or queues a run.

On PostgreSQL one listener thread per process holds a single ``LISTEN`` connection and fans the
notifications out to every waiting stream or worker loop (not one connection per client). On
SQLite there is no cross-process signal, so waiters poll with a short timeout. Either way a
notification is only a hint: waiters re-read the database, which is the source of truth, so a
missed or duplicated notification can delay delivery by one poll but never lose or repeat data.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from sqlalchemy.engine import make_url

from agentledger.dialect import EVENTS_CHANNEL, QUEUE_CHANNEL

log = logging.getLogger("agentledger.notifier")


class EventNotifier:
    def __init__(self, database_url: str, *, is_postgres: bool, poll_seconds: float = 0.1):
        self._url = database_url
        self.is_postgres = is_postgres
        self.poll_seconds = poll_seconds
        self._cond = threading.Condition(threading.RLock())
        # key -> [generation, subscribers]; only keys someone waits on are tracked.
        self._subscriptions: dict[str, list[int]] = {}
        self._queue_generation = 0
        self._listening = False
        self._started = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- waiting -------------------------------------------------------------------------

    @property
    def fallback_timeout(self) -> float:
        """How long a waiter sleeps when no notification comes (a safety net on PostgreSQL)."""
        return 1.0 if (self.is_postgres and self._listening) else self.poll_seconds

    def subscribe(self, key: str) -> None:
        self.ensure_started()
        with self._cond:
            self._subscriptions.setdefault(key, [0, 0])[1] += 1

    def unsubscribe(self, key: str) -> None:
        with self._cond:
            entry = self._subscriptions.get(key)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del self._subscriptions[key]

    def generation(self, key: str) -> int:
        with self._cond:
            entry = self._subscriptions.get(key)
            return entry[0] if entry else 0

    def wait(self, key: str, seen: int, timeout: float) -> int:
        """Block until ``key`` changes after generation ``seen`` or ``timeout`` passes."""
        deadline = time.monotonic() + max(0.0, min(timeout, self.fallback_timeout))
        with self._cond:
            while self.generation(key) == seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self.generation(key)

    def queue_generation(self) -> int:
        self.ensure_started()
        with self._cond:
            return self._queue_generation

    def wait_for_queue(self, seen: int, timeout: float) -> int:
        deadline = time.monotonic() + max(0.0, min(timeout, self.fallback_timeout))
        with self._cond:
            while self._queue_generation == seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._queue_generation

    # ---- signalling ----------------------------------------------------------------------

    def signal(self, channel: str, payload: str) -> None:
        """Record a notification (from the listener, or from this process's own writes)."""
        with self._cond:
            if channel == QUEUE_CHANNEL:
                self._queue_generation += 1
            elif payload in self._subscriptions:
                self._subscriptions[payload][0] += 1
            else:
                return
            self._cond.notify_all()

    # ---- the PostgreSQL listener ---------------------------------------------------------

    def ensure_started(self) -> None:
        if self._started or not self.is_postgres:
            return
        with self._cond:
            if self._started:
                return
            self._started = True
        self._thread = threading.Thread(target=self._listen_forever, name="agentledger-listen",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _conninfo(self) -> str:
        url = make_url(self._url).set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    def _listen_forever(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo(), autocommit=True) as conn:
                    conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    conn.execute(f"LISTEN {QUEUE_CHANNEL}")
                    self._listening = True
                    backoff = 0.5
                    # Wake everyone once: anything sent while we were not listening is re-read.
                    self._wake_all()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self.signal(note.channel, note.payload)
            except psycopg.Error as exc:
                log.warning("notification listener lost its connection (%s); retrying", exc)
            finally:
                self._listening = False
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def _wake_all(self) -> None:
        with self._cond:
            for entry in self._subscriptions.values():
                entry[0] += 1
            self._queue_generation += 1
            self._cond.notify_all()
