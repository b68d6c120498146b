"""The executor: claims queued runs and runs their agent kinds, in threads.

- Concurrency is a number of *slots*. A parent waiting for its delegated children gives its slot
  back while it waits (and gets priority to take one again), so children can run even with
  ``--concurrency 1``.
- A monitor thread renews every held lease each ``heartbeat_seconds`` and checks, every quarter
  second, whether a run is being cancelled (the agent then stops within a second and the
  executor appends exactly one ``run.cancelled``) or was ended by someone else (the run is
  dropped; nothing more is written for it).
- Progress events an agent emits (deltas, tool calls, usage: the informational types) wait up
  to ``APPEND_DELAY`` (20 ms) to share one append transaction with the events after them, and
  a run's last ones are written with its terminal event. A stream of deltas then costs a few
  transactions instead of one each; an event is in the ledger at most 20 ms after it was
  emitted (a flusher thread writes what waited that long). Their data is checked when emitted,
  so a refused event still fails the run at the agent's call, with nothing after it written.
- Every write goes through ``ingest`` with this executor's instance id, so a write after the
  lease was lost is refused by the database transaction, never half-applied. Where the writes
  and reads go is the executor's backend (``worker.backends``): the database in-process, or a
  ledger server's executor routes (``worker.http_backend``, for ``agentledger worker --api``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field

from agentledger.agent_kinds import (
    AGENT_RAISES,
    AgentFailed,
    RunCancelled,
    RunContext,
    bind_current_run,
    error_message,
    kind_for,
    unbind_current_run,
)
from agentledger.agent_kinds.storage import FrameworkStorage
from agentledger.core.config import MAX_CLAIM, Settings
from agentledger.core.database import Database
from agentledger.core.dialect import QUEUE_CHANNEL
from agentledger.core.errors import (
    CancelRequested,
    Forbidden,
    IllegalTransition,
    LeaseLost,
    LedgerError,
    RunTerminal,
    Unauthenticated,
    UnknownAgent,
    ValidationFailed,
)
from agentledger.core.notifier import EventNotifier
from agentledger.core.vocabulary import PROGRESS_EVENTS, TERMINAL
from agentledger.worker.backends import DatabaseBackend, ExecutorBackend
from agentledger.worker.failures import Failing, database_failure, error_name
from agentledger.worker.run_threads import RunThreads
from ingest.event_types import validated_data
from ingest.leases import ClaimedRun

log = logging.getLogger("agentledger.executor")

MONITOR_PERIOD = 0.25
APPEND_DELAY = 0.02  # seconds a progress event may wait to share a transaction
MAX_PENDING = 200  # progress events written at once, whatever their age


class _Dropped(Exception):
    """The run is no longer ours (lease lost, ended elsewhere, or this executor is stopping)."""


@dataclass
class _Active:
    run_id: str
    cancel: threading.Event = field(default_factory=threading.Event)
    dropped: threading.Event = field(default_factory=threading.Event)
    last_heartbeat: float = field(default_factory=time.monotonic)
    holds_slot: bool = True
    # Set while the run's terminal event is being written: a heartbeat racing it would find the
    # run ended and report a lease lost that was in fact given back.
    ending: bool = False
    # Progress events emitted but not written yet (oldest first), since when, and the write
    # lock that keeps the agent's thread and the flusher writing them in order.
    pending: list[tuple[str, dict]] = field(default_factory=list)
    pending_since: float | None = None
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    # What the flusher's write of this run raised, for the agent's thread to raise next.
    write_error: BaseException | None = None
    # Set once the run's terminal event is written: nothing is left to interrupt.
    ended: bool = False


class Executor:
    def __init__(self, db: Database | None, settings: Settings, *, instance_id: str,
                 concurrency: int = 4, notifier: EventNotifier | None = None,
                 backend: ExecutorBackend | None = None):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.db = db
        self.settings = settings
        self.instance_id = instance_id
        self.concurrency = concurrency
        if backend is None:
            assert db is not None, "an executor needs a database or a backend"
            backend = DatabaseBackend(db, instance_id, notifier)
        self.backend: ExecutorBackend = backend
        # The frameworks' memory for this executor's runs on its database: connections opened
        # by the first run that needs them, at most one per slot, closed by ``stop``.
        self.storage = (FrameworkStorage(db.url, max_connections=concurrency)
                        if db is not None else None)
        self.notifier = backend.notifier
        self._slots = threading.Condition()
        self._busy = 0
        self._resuming = 0
        self._active: dict[str, _Active] = {}
        self._active_lock = threading.Lock()
        self._stopping = threading.Event()
        # Once stopping: every run held when the stop began or claimed since, unended, also
        # after its thread let go of it (``stop`` interrupts them all).
        self._leaving: dict[str, _Active] = {}
        self._threads: list[threading.Thread] = []
        self._flush_kick = threading.Event()
        self._run_threads = RunThreads()
        self.started_runs = 0
        # Set when the ledger refused this executor's token: it claims nothing more.
        self.refusal: LedgerError | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> list[str]:
        """Interrupt what a previous incarnation of this instance left, then start working."""
        leftovers = self.backend.interrupt_held("service_restart", [])
        if leftovers:
            log.warning("%s: interrupted %d run(s) left by a previous start (service_restart)",
                        self.instance_id, len(leftovers))
        self.notifier.on_cancel(self._cancel_heard)
        for target, name in ((self._claim_loop, "claim"), (self._monitor_loop, "monitor"),
                             (self._flush_loop, "flush")):
            thread = threading.Thread(target=target, name=f"agentledger-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return leftovers

    def stop(self, *, reason: str = "executor_shutdown", timeout: float = 5.0) -> list[str]:
        """Stop claiming, end this instance's unfinished runs ``interrupted``, and return them."""
        self.notifier.off_cancel(self._cancel_heard)
        with self._active_lock:
            # Taken with the flag set under the lock, before any run sees the stop: a run that
            # lets go of its run on seeing it (a parent waiting on its children, an agent at
            # its next write) still holds its lease, and is interrupted below with the others.
            self._stopping.set()
            self._leaving.update(self._active)
        # Wake the claim loop (it may be waiting up to a second for a queue notification) and
        # any slot waiter, so that stopping takes milliseconds, not a fallback period.
        self.notifier.signal(QUEUE_CHANNEL, "executor-stopping")
        with self._slots:
            self._slots.notify_all()
        self._flush_kick.set()
        for thread in self._threads:
            thread.join(timeout)
        with self._active_lock:
            self._leaving.update(self._active)  # claimed while the claim loop stopped
            actives = [a for a in self._leaving.values() if not a.ended]
            self._leaving.clear()
            held = [a.run_id for a in actives]
            for active in actives:
                active.dropped.set()
        for active in actives:  # what the runs emitted is written before they are interrupted
            self._flush_quietly(active)
        ended = self.backend.interrupt_held(reason, held)
        if ended:
            log.warning("%s: stopping; interrupted %d run(s) (%s)", self.instance_id, len(ended), reason)
        if self.storage is not None:
            self.storage.close()
        return ended

    @property
    def active_run_ids(self) -> list[str]:
        with self._active_lock:
            return list(self._active)

    # ---- slots ---------------------------------------------------------------------------

    def _reserve(self, wanted: int) -> int:
        with self._slots:
            free = max(0, self.concurrency - self._busy - self._resuming)
            n = min(wanted, free)
            self._busy += n
            return n

    def _release(self, n: int = 1) -> None:
        with self._slots:
            self._busy -= n
            self._slots.notify_all()

    def _reacquire(self, active: _Active) -> None:
        with self._slots:
            self._resuming += 1
            try:
                while self._busy >= self.concurrency:
                    if self._stopping.is_set() or active.dropped.is_set():
                        raise _Dropped()
                    self._slots.wait(MONITOR_PERIOD)
                self._busy += 1
            finally:
                self._resuming -= 1

    # ---- claiming ------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        failing = Failing("claims")
        while not self._stopping.is_set():
            # One claim takes at most MAX_CLAIM runs: more slots are filled by the next turns.
            reserved = self._reserve(min(self.concurrency, MAX_CLAIM))
            if reserved == 0:
                with self._slots:
                    self._slots.wait(MONITOR_PERIOD)
                continue
            seen = self.notifier.queue_generation()
            try:
                claimed = self.backend.claim(reserved, self.settings.lease_seconds)
                failing.passed()
            except (Unauthenticated, Forbidden, ValidationFailed) as exc:
                # Not a hiccup: the ledger refuses this executor's token (unknown, revoked, or
                # not an executor's) or its claim's own fixed terms (its instance id, such as
                # one under the prefix of recorded runs). Claiming on would repeat the refusal
                # forever; whoever runs the executor is told (``refusal``) and decides.
                self._release(reserved)
                self.refusal = exc
                log.error("%s: the ledger refuses this executor's claims (%s: %s); it claims "
                          "no more runs", self.instance_id, exc.code, exc.message)
                return
            except Exception as exc:  # noqa: BLE001 - keep claiming after a database hiccup
                failing.failed_with(exc)  # the ledger unreachable, its database, or a bug
                claimed = []
                self._stopping.wait(1.0)
            if reserved > len(claimed):
                self._release(reserved - len(claimed))
            for run in claimed:
                self._launch(run)
            if len(claimed) < reserved:
                # Fewer than asked for: every run claimable when the claim began is taken, so
                # claiming again at once would find nothing. The generation was read before
                # the claim, so a run queued since then returns from this wait at once.
                self.notifier.wait_for_queue(seen, 1.0)

    def _launch(self, run: ClaimedRun) -> None:
        active = _Active(run.run_id)
        with self._active_lock:
            self._active[run.run_id] = active
        self.started_runs += 1
        self._run_threads.submit(self._execute, run, active)

    # ---- running one run -----------------------------------------------------------------

    def _execute(self, run: ClaimedRun, active: _Active) -> None:
        unfinished: list[threading.Thread] = []
        try:
            ctx = RunContext(run_id=run.run_id, thread_id=run.thread_id, input=run.input,
                             agent_execution_snapshot=run.agent_execution_snapshot,
                             context_pack_snapshot=run.context_pack_snapshot,
                             context=run.context, port=self,
                             history_source=functools.partial(self.backend.history, run.run_id),
                             storage=self.storage,
                             memory=self.backend.memory(run.run_id))
            unfinished = ctx.unfinished
            if run.history is not None:  # read with the claim (an executor over the API)
                ctx.history = list(run.history)
            kind_name = run.agent_execution_snapshot.get("kind")
            kind = kind_for(kind_name)
            try:
                if kind is None:
                    raise AgentFailed(f"no agent kind {kind_name!r} on executor {self.instance_id}",
                                      code="unknown_agent_kind")
                bound = bind_current_run(ctx)
                try:
                    answer = kind(ctx)
                finally:
                    unbind_current_run(bound)
                completed = dict(ctx.completion)
                if answer is not None:
                    completed["content"] = answer
                self._end(active, "run.completed", completed)
            except RunCancelled:
                self._end(active, "run.cancelled", {"external_stop_confirmed": True})
            except AgentFailed as exc:
                self._end(active, "run.failed", {"error": {"code": exc.code, "message": exc.message}})
            except _Dropped:
                raise
            except (ValidationFailed, UnknownAgent) as exc:
                # The agent asked for something the ledger refuses (an event whose data does not
                # fit its type, a child of an unregistered agent); nothing of it was written.
                # The run fails with the reason instead of hanging until its lease expires.
                self._end(active, "run.failed", {"error": {"code": exc.code, "message": exc.message}})
            except LedgerError:
                raise
            except AGENT_RAISES as exc:  # noqa: BLE001 - an agent's bug fails its run, not the worker
                if database_failure(exc) is not None:
                    raise  # not the agent's bug: the run is let go of below
                log.exception("agent of run %s raised", run.run_id)
                self._end(active, "run.failed",
                          {"error": {"code": "agent_exception",
                                     "message": error_message(f"{type(exc).__name__}: {exc}")}})
        except (_Dropped, LeaseLost, RunTerminal) as exc:
            if self._stopping.is_set():
                # ``stop`` records the run interrupted (it ended otherwise: nothing to record).
                log.info("run %s: left as the executor stops", run.run_id)
            else:
                log.warning("dropping run %s: %s", run.run_id,
                            getattr(exc, "message", "no longer ours"))
        except LedgerError as exc:
            log.error("run %s: write refused: %s", run.run_id, exc.message)
        except Exception as exc:  # noqa: BLE001
            failure = database_failure(exc)
            if failure is None:
                log.exception("run %s: executor error", run.run_id)
            else:
                log.warning("dropping run %s: the database failed (%s); its lease expires and "
                            "the reconciler ends it interrupted", run.run_id, error_name(failure))
        finally:
            with self._active_lock:
                self._active.pop(run.run_id, None)
                if self._stopping.is_set() and not active.ended:
                    self._leaving[run.run_id] = active
            # Work the agent left running when the run was cancelled (agent_kinds'
            # framework_thread) can write nothing more, but still occupies this executor: the
            # slot is given back when it ends, so the concurrency stays what it says.
            for thread in unfinished:
                thread.join()
            if active.holds_slot:
                self._release()

    def _end(self, active: _Active, event_type: str, data: dict) -> None:
        self._check(active, allow_cancel=True)
        active.ending = True
        with active.write_lock:
            self._raise_deferred(active)
            try:
                self._write_with_pending(active, [(event_type, data)])
            except CancelRequested:
                # Cancelled while finishing: the cancel wins; confirm it instead of completing.
                self._write_with_pending(active, [("run.cancelled", {"external_stop_confirmed": True})])
            active.ended = True

    def _append(self, active: _Active, events: list[tuple[str, dict]]):
        result = self.backend.append(active.run_id, events)
        if result.cancel_requested:
            active.cancel.set()
        return result

    # ---- progress events that wait to share a transaction --------------------------------

    @staticmethod
    def _take_pending(active: _Active) -> list[tuple[str, dict]]:
        """The events waiting (the caller holds ``active.write_lock``)."""
        waiting, active.pending, active.pending_since = active.pending, [], None
        return waiting

    def _flush(self, active: _Active) -> None:
        with active.write_lock:
            self._flush_locked(active)

    def _flush_locked(self, active: _Active) -> None:
        if active.pending:
            self._write_with_pending(active, [])

    def _write_with_pending(self, active: _Active, events: list[tuple[str, dict]]) -> None:
        """Append what waits, then ``events``, in one transaction (the caller holds the write
        lock). A refused batch wrote nothing: what waited waits again, for the run's end."""
        waiting = self._take_pending(active)
        try:
            self._append(active, [*waiting, *events])
        except BaseException:
            if waiting:
                active.pending[:0] = waiting
                active.pending_since = active.pending_since or time.monotonic()
            raise

    def _flush_quietly(self, active: _Active) -> None:
        """Write what waits, from a thread that is not the run's: an error is kept for the
        run's thread to raise at its next write; a lease or run lost drops the run."""
        with active.write_lock:
            try:
                self._flush_locked(active)
            except Exception as exc:  # noqa: BLE001 - raised in the run's thread instead
                active.write_error = exc
                # not retried from here: the run's thread meets the error at its next write
                active.pending_since = None
                if isinstance(exc, LeaseLost | RunTerminal | IllegalTransition):
                    active.dropped.set()

    @staticmethod
    def _raise_deferred(active: _Active) -> None:
        error, active.write_error = active.write_error, None
        if error is not None:
            raise error

    def _flush_loop(self) -> None:
        while not self._stopping.is_set():
            self._flush_kick.clear()  # before the scan: an emit after it sets it again
            with self._active_lock:
                actives = list(self._active.values())
            now = time.monotonic()
            next_due = None
            for active in actives:
                since = active.pending_since
                if since is None:
                    continue
                due = since + APPEND_DELAY
                if due <= now:
                    self._flush_quietly(active)
                elif next_due is None or due < next_due:
                    next_due = due
            self._flush_kick.wait(None if next_due is None else max(0.0, next_due - now))

    def _check(self, active: _Active, *, allow_cancel: bool = False) -> None:
        if active.dropped.is_set() or self._stopping.is_set():
            raise _Dropped()
        if active.cancel.is_set() and not allow_cancel:
            raise RunCancelled()

    # ---- the ExecutionPort used by agent kinds -------------------------------------------

    def _active_for(self, run_id: str) -> _Active:
        with self._active_lock:
            found = self._active.get(run_id)
        if found is None:
            raise _Dropped()
        return found

    def emit(self, run_id: str, event_type: str, data: dict) -> None:
        active = self._active_for(run_id)
        self._check(active)
        if event_type not in PROGRESS_EVENTS:
            with active.write_lock:
                self._raise_deferred(active)
                self._check(active)
                self._write_with_pending(active, [(event_type, data)])
        else:
            validated_data(event_type, data)  # refused now, at the agent's call, as by the ledger
            with active.write_lock:
                self._raise_deferred(active)
                # Again under the lock: a flusher write that just saw a cancel request (and
                # held the lock meanwhile) stops the agent here, before one more event waits.
                self._check(active)
                active.pending.append((event_type, data))
                first = active.pending_since is None
                if first:
                    active.pending_since = time.monotonic()
                full = len(active.pending) >= MAX_PENDING
            if full:
                self._flush(active)
            elif first:
                self._flush_kick.set()
        self._check(active)

    def check(self, run_id: str) -> None:
        self._check(self._active_for(run_id))

    def sleep(self, run_id: str, seconds: float) -> None:
        active = self._active_for(run_id)
        deadline = time.monotonic() + seconds
        while True:
            self._check(active)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            active.cancel.wait(min(remaining, MONITOR_PERIOD))

    def delegate(self, run_id: str, children: list[dict[str, str]]) -> list[dict]:
        active = self._active_for(run_id)
        self._check(active)
        with active.write_lock:  # what the agent emitted comes before its children
            self._raise_deferred(active)
            self._flush_locked(active)
        try:
            child_ids = self.backend.create_children(run_id, children)
        except (CancelRequested, IllegalTransition):
            # With our lease still valid, the only refusal is a parent that is being cancelled
            # (the cancel came after the last check; ``IllegalTransition`` from servers before
            # ``cancel_requested`` was this refusal's code): confirm it, no child was created.
            active.cancel.set()
            raise RunCancelled() from None
        active.holds_slot = False
        self._release()
        results = self._wait_for_children(active, child_ids)
        self._reacquire(active)
        active.holds_slot = True
        self._check(active)
        return results

    def _wait_for_children(self, active: _Active, child_ids: list[str]) -> list[dict]:
        key = active.run_id
        self.notifier.subscribe(key)
        try:
            while True:
                self._check(active)
                seen = self.notifier.generation(key)
                by_id = self.backend.run_states(child_ids)
                if len(by_id) == len(set(child_ids)) and all(
                        r.status in TERMINAL for r in by_id.values()):
                    return [{"run_id": c, "status": by_id[c].status,
                             "final_message_id": by_id[c].final_message_id} for c in child_ids]
                self.notifier.wait(key, seen, MONITOR_PERIOD)
        finally:
            self.notifier.unsubscribe(key)

    # ---- leases and cancel detection -----------------------------------------------------

    def _monitor_loop(self) -> None:
        failing = Failing("the lease monitor")
        while not self._stopping.wait(MONITOR_PERIOD):
            with self._active_lock:
                actives = list(self._active.values())
            if not actives:
                continue
            try:
                self._poll_statuses(actives)
                self._heartbeat_due(actives)
                failing.passed()
            except Exception as exc:  # noqa: BLE001 - the next period tries again
                failing.failed_with(exc)

    def _cancel_heard(self, run_id: str) -> None:
        """A cancel request of ``run_id`` committed: stop its agent now, not at the monitor's
        next look (up to ``MONITOR_PERIOD`` later), which stays the safety net."""
        with self._active_lock:
            active = self._active.get(run_id)
        if active is not None:
            active.cancel.set()

    def _poll_statuses(self, actives: list[_Active]) -> None:
        status = self.backend.run_states([a.run_id for a in actives])
        for active in actives:
            row = status.get(active.run_id)
            if row is None or row.status in TERMINAL or row.executor_instance_id != self.instance_id:
                active.dropped.set()
            elif row.status == "cancelling":
                active.cancel.set()

    def _heartbeat_due(self, actives: list[_Active]) -> None:
        now = time.monotonic()
        for active in actives:
            if (active.dropped.is_set() or active.ending
                    or now - active.last_heartbeat < self.settings.heartbeat_seconds):
                continue
            try:
                beat = self.backend.heartbeat(active.run_id, self.settings.lease_seconds)
                active.last_heartbeat = now
                if beat.cancel_requested:
                    active.cancel.set()
            except LeaseLost:
                if active.ending:
                    continue  # the run ended while we renewed: nothing was lost
                log.warning("run %s: lease lost; dropping it", active.run_id)
                active.dropped.set()
