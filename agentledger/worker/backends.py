"""Where an executor's writes and reads go: the ledger's database, or a ledger server over HTTP.

``Executor`` talks to one ``ExecutorBackend``: claim, heartbeat, append, create children, read
run states (its own runs' status and owner, its children's status and answer), interrupt what it
holds, reach a run's framework memory when it cannot open the database (``memory``), and a
``notifier`` to wait on for wake-ups. ``DatabaseBackend`` calls ``ingest`` in
short transactions and is woken by the database's notifications; ``HttpBackend``
(``agentledger.worker.http_backend``) calls the executor routes and polls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agentledger.agent_kinds.run_context import MemoryPort
from agentledger.core.database import Database
from agentledger.core.notifier import EventNotifier
from ingest.events import AppendResult, append_events_alone
from ingest.leases import ClaimedRun, Heartbeat, claim_runs, heartbeat
from ingest.reconcile import executor_run_ids, interrupt_executor_run
from ingest.runs import create_child_run
from queries.run_states import run_states_read
from queries.thread_history import as_turns, thread_history


@dataclass(frozen=True)
class RunState:
    status: str
    executor_instance_id: str | None
    final_message_id: str | None


class Notifier(Protocol):
    """The part of ``EventNotifier`` an executor waits on."""

    def signal(self, channel: str, payload: str) -> None: ...
    def queue_generation(self) -> int: ...
    def wait_for_queue(self, seen: int, timeout: float) -> int: ...
    def subscribe(self, key: str) -> None: ...
    def unsubscribe(self, key: str) -> None: ...
    def generation(self, key: str) -> int: ...
    def wait(self, key: str, seen: int, timeout: float) -> int: ...
    def on_cancel(self, listener: Callable[[str], None]) -> None: ...
    def off_cancel(self, listener: Callable[[str], None]) -> None: ...
    def stop(self) -> None: ...


class ExecutorBackend(Protocol):
    @property
    def notifier(self) -> Notifier: ...

    def claim(self, max_runs: int, lease_seconds: float) -> list[ClaimedRun]: ...
    def history(self, run_id: str) -> list[dict]: ...
    def heartbeat(self, run_id: str, lease_seconds: float) -> Heartbeat: ...
    def append(self, run_id: str, events: list[tuple[str, dict]]) -> AppendResult: ...
    def create_children(self, run_id: str, children: list[dict[str, str]]) -> list[str]: ...
    def run_states(self, run_ids: list[str]) -> dict[str, RunState]: ...
    def interrupt_held(self, reason: str, held: list[str]) -> list[str]: ...
    def memory(self, run_id: str) -> MemoryPort | None: ...


class DatabaseBackend:
    """The executor in a process with the ledger's database: ``ingest`` in short transactions."""

    def __init__(self, db: Database, instance_id: str, notifier: EventNotifier | None = None):
        self.db = db
        self.instance_id = instance_id
        if notifier is None:
            notifier = EventNotifier(db.url, is_postgres=db.is_postgres)
            notifier.hear_commits_of(db)
        self.notifier = notifier

    def claim(self, max_runs: int, lease_seconds: float) -> list[ClaimedRun]:
        # The thread's turns are read when an agent asks for them (``history``), not per claim.
        with self.db.write() as s:
            return claim_runs(s, self.instance_id, max_runs=max_runs, lease_seconds=lease_seconds,
                              with_history=False)

    def history(self, run_id: str) -> list[dict]:
        with self.db.read(primary=True) as s:  # the executor never reads a replica
            return as_turns(thread_history(s, run_id))

    def heartbeat(self, run_id: str, lease_seconds: float) -> Heartbeat:
        with self.db.write() as s:
            return heartbeat(s, run_id, self.instance_id, lease_seconds=lease_seconds)

    def append(self, run_id: str, events: list[tuple[str, dict]]) -> AppendResult:
        return append_events_alone(self.db, run_id, events, executor_instance_id=self.instance_id)

    def create_children(self, run_id: str, children: list[dict[str, str]]) -> list[str]:
        """All the children in one transaction, or none."""
        with self.db.write() as s:
            return [create_child_run(s, run_id, agent_id=c["agent_id"], input=c.get("input", ""),
                                     executor_instance_id=self.instance_id) for c in children]

    def run_states(self, run_ids: list[str]) -> dict[str, RunState]:
        # The primary: children it created a moment ago. Every held run's state is read every
        # quarter second (``Executor._monitor_loop``): one statement whose SQL is fixed (the
        # ids as one array), which runs on the driver.
        rows = self.db.read_rows(*run_states_read(run_ids, postgres=self.db.is_postgres),
                                 primary=True)
        return {r.id: RunState(r.status, r.executor_instance_id, r.final_message_id) for r in rows}

    def interrupt_held(self, reason: str, held: list[str]) -> list[str]:
        """Every unfinished run leased to this instance (``held`` or not: also those a previous
        incarnation of it left), one transaction each. In one transaction, two instances that
        stop or start at once deadlocked: each had ended some runs of trees the other holds
        runs of (and so held their rows and the interruption count's) and waited for a row the
        other held; on ``serve`` the deadlock made a worker process fail to boot."""
        with self.db.read(primary=True) as s:
            run_ids = executor_run_ids(s, self.instance_id)
        ended = []
        for run_id in run_ids:
            with self.db.write() as s:
                if interrupt_executor_run(s, run_id, self.instance_id, reason=reason):
                    ended.append(run_id)
        return ended

    def memory(self, run_id: str) -> MemoryPort | None:
        return None  # the kinds open their frameworks' storage on the database themselves


class PollingNotifier:
    """A notifier without a database: waits end on ``signal`` (a stopping executor) or after
    ``poll_seconds``, so that an executor over HTTP polls at that pace. ``queue_poll_seconds``
    (default: the same) paces the claim loop; 0 when the claims themselves wait on the
    server."""

    def __init__(self, poll_seconds: float = 0.5, *, queue_poll_seconds: float | None = None):
        self.poll_seconds = poll_seconds
        self.queue_poll_seconds = poll_seconds if queue_poll_seconds is None else queue_poll_seconds
        self._changed = threading.Condition()
        self._generation = 0

    def signal(self, channel: str, payload: str) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def _wait(self, seen: int, timeout: float, period: float | None = None) -> int:
        period = self.poll_seconds if period is None else period
        deadline = time.monotonic() + max(0.0, min(timeout, period))
        with self._changed:
            while self._generation == seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            return self._generation

    def queue_generation(self) -> int:
        with self._changed:
            return self._generation

    def wait_for_queue(self, seen: int, timeout: float) -> int:
        return self._wait(seen, timeout, self.queue_poll_seconds)

    def subscribe(self, key: str) -> None:
        pass

    def unsubscribe(self, key: str) -> None:
        pass

    def generation(self, key: str) -> int:
        return self.queue_generation()

    def wait(self, key: str, seen: int, timeout: float) -> int:
        return self._wait(seen, timeout)

    def on_cancel(self, listener: Callable[[str], None]) -> None:
        pass  # no database to hear: the executor's monitor finds cancel requests by polling

    def off_cancel(self, listener: Callable[[str], None]) -> None:
        pass

    def stop(self) -> None:
        self.signal("", "stop")
