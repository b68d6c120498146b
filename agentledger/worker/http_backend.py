"""The executor's backend over a ledger server's executor routes (``agentledger worker --api``).

It needs no database: claims, heartbeats, appends and children go through ``ExecutorClient``;
the states of held runs and of delegated children are read with ``GET /api/agent-runs/{id}``
(which an ``executor`` token may read); the framework memory of a run's thread (LangGraph
checkpoints, Agents SDK session) through the server's memory routes (``HttpMemory``). Error
answers come back as the ledger's own exceptions (``lease_lost`` → ``LeaseLost``, …), so the
executor handles them exactly as in-process.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from agentledger.agent_kinds import AgentFailed
from agentledger.client import ApiError, ExecutorClient
from agentledger.core.config import Settings
from agentledger.core.errors import (
    FrameworkUnavailable,
    InvalidRequest,
    LedgerError,
    NotFound,
    PayloadTooLarge,
    ValidationFailed,
)
from agentledger.worker.backends import PollingNotifier, RunState
from ingest.events import AppendResult
from ingest.leases import ClaimedRun, Heartbeat

TERMINAL_STATUS = {"run.completed": "succeeded", "run.failed": "failed",
                   "run.cancelled": "cancelled", "run.interrupted": "interrupted"}
log = logging.getLogger("agentledger.executor")
_CLAIMED_FIELDS = {f.name for f in dataclasses.fields(ClaimedRun)}
# How long an empty claim waits on the server for work. It bounds how late a missed
# notification starts a run, and how long stopping waits for the claim in flight (a waiting
# claim takes no run); an idle worker claims about once per period.
CLAIM_WAIT_SECONDS = 1.0
# A run's write that cannot reach the server is tried again for as long as the worker's lease
# (``claim``'s ``lease_seconds``): heartbeats cannot reach the server either, so past that the
# lease has certainly expired and the server would refuse the write (``lease_lost``); within it
# a server back from a restart still holds the run for this worker. The run's thread waits
# meanwhile, as it would for a slow answer.


def _ledger_errors() -> dict[str, type[LedgerError]]:
    found: dict[str, type[LedgerError]] = {}
    pending = [LedgerError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


_BY_CODE = _ledger_errors()


class LedgerUnreachable(LedgerError):
    """No usable answer from the server (after the client's retries): the executor drops the
    run rather than fail it on a guess; the server's reconciler ends it at lease expiry."""

    status, code = 503, "ledger_unreachable"


@contextmanager
def _as_ledger_errors() -> Iterator[None]:
    try:
        yield
    except ApiError as exc:
        cls = _BY_CODE.get(exc.code)
        if cls is None or exc.status is None:
            raise LedgerUnreachable(str(exc)) from exc
        raise cls(exc.message) from exc


def claimed_run(item: dict) -> ClaimedRun:
    """A claim answer's run as the executor's ``ClaimedRun`` (fields it does not know of are
    left out, fields the server did not send keep their defaults)."""
    values = {k: v for k, v in item.items() if k in _CLAIMED_FIELDS}
    values["lease_expires_at"] = datetime.fromisoformat(item["lease_expires_at"])
    values.setdefault("root_run_id", item["run_id"])
    values.setdefault("parent_run_id", None)
    values.setdefault("context", [])
    return ClaimedRun(**values)


class HttpMemory:
    """``RunContext.memory`` of a run executed over HTTP: its thread's framework memory through
    the server's memory routes (``ExecutorClient.memory``). A refusal of what the agent asked to
    store or read (a value the server does not rebuild, a body it cannot take, a framework it
    lacks) fails the run with the server's sentence; a lost lease or an unreachable server is
    the ledger's own error, which drops the run as for any other write."""

    def __init__(self, client: ExecutorClient, run_id: str):
        self.client = client
        self.run_id = run_id

    def call(self, operation: str, body: dict) -> dict:
        try:
            with _as_ledger_errors():
                return self.client.memory(self.run_id, operation, body)
        except FrameworkUnavailable as exc:
            raise AgentFailed(exc.message, code="agent_unavailable") from None
        except NotFound as exc:
            # The run exists (this executor holds it): the server has no such route.
            raise AgentFailed(f"the ledger server at {self.client.base_url} does not keep "
                              f"framework memory for executors ({exc.message}); upgrade it",
                              code="agent_unavailable") from None
        except (ValidationFailed, InvalidRequest, PayloadTooLarge) as exc:
            raise AgentFailed(exc.message, code="agent_error") from None


class HttpBackend:
    """Claims wait on the server for work (``wait_seconds``), so the claim loop does not poll;
    a server that does not know the field (an older version) is polled every ``poll_seconds``."""

    def __init__(self, client: ExecutorClient, *, poll_seconds: float = 0.5,
                 claim_wait_seconds: float = CLAIM_WAIT_SECONDS):
        self.client = client
        self.instance_id = client.instance_id
        self.claim_wait_seconds = claim_wait_seconds
        # The lease of the latest claim (a run is appended to only once claimed).
        self.lease_seconds = Settings.lease_seconds
        self.notifier = PollingNotifier(
            poll_seconds, queue_poll_seconds=0 if claim_wait_seconds else None)

    def claim(self, max_runs: int, lease_seconds: float) -> list[ClaimedRun]:
        self.lease_seconds = lease_seconds
        try:
            with _as_ledger_errors():
                found = self.client.claim(max_runs, lease_seconds=lease_seconds,
                                          wait_seconds=self.claim_wait_seconds or None)
        except (InvalidRequest, ValidationFailed) as exc:
            if not self.claim_wait_seconds or "wait_seconds" not in exc.message:
                raise
            log.info("the ledger server does not hold claims (%s); polling every %.1f s",
                     exc.message, self.notifier.poll_seconds)
            self.claim_wait_seconds = 0
            self.notifier.queue_poll_seconds = self.notifier.poll_seconds
            return self.claim(max_runs, lease_seconds)
        return [claimed_run(r) for r in found]

    def history(self, run_id: str) -> list[dict]:
        # The claim answer always carries the turns (CONTRACT §7), so the executor never asks.
        raise RuntimeError(f"run {run_id}: the claim answer carried no history")

    def heartbeat(self, run_id: str, lease_seconds: float) -> Heartbeat:
        with _as_ledger_errors():
            beat = self.client.heartbeat(run_id)
        return Heartbeat(datetime.fromisoformat(beat["lease_expires_at"]), beat["cancel_requested"])

    def append(self, run_id: str, events: list[tuple[str, dict]]) -> AppendResult:
        # A write that certainly never arrived is repeated while the lease may hold: a server
        # restarting, or refusing connections for a while, does not drop the run to end at its
        # lease's expiry with what it said so far lost. One whose answer was lost is repeated
        # too: it carries an Idempotency-Key, and the server answers a repeat of what it wrote.
        with _as_ledger_errors():
            done = self.client.append(run_id, events, unsent_seconds=self.lease_seconds)
        ending = TERMINAL_STATUS.get(events[-1][0]) if events else None
        status = ending or ("cancelling" if done["cancel_requested"] else "running")
        return AppendResult(run_id, done["seqs"], status, done["cancel_requested"])

    def create_children(self, run_id: str, children: list[dict[str, str]]) -> list[str]:
        """One request per child: a refusal part-way leaves the earlier children, which the
        parent's cancel (the only refusal while the lease holds) then cancels too."""
        with _as_ledger_errors():
            return [self.client.create_child(run_id, c["agent_id"], c.get("input", ""))["run_id"]
                    for c in children]

    def run_states(self, run_ids: list[str]) -> dict[str, RunState]:
        states = {}
        for run_id in run_ids:
            try:
                with _as_ledger_errors():
                    run = self.client.get_run(run_id)
            except NotFound:
                continue
            states[run_id] = RunState(run["status"], run["executor_instance_id"],
                                      run["final_message_id"])
        return states

    def memory(self, run_id: str) -> HttpMemory:
        return HttpMemory(self.client, run_id)

    def interrupt_held(self, reason: str, held: list[str]) -> list[str]:
        """The runs this executor still holds, ended ``interrupted`` through the events route (a
        run that ended meanwhile, or whose lease is gone, is skipped). Runs a previous
        incarnation left are not known here: the server's reconciler ends them at lease expiry."""
        ended = []
        for run_id in held:
            try:
                self.client.append(run_id, [("run.interrupted", {
                    "reason": reason, "executor_instance_id": self.instance_id})])
            except ApiError as exc:
                if exc.code == "cancel_requested":  # the reconciler ends a run being cancelled
                    log.info("run %s: being cancelled; left to the server's reconciler", run_id)
                else:
                    log.warning("run %s: could not record %s: %s", run_id, reason, exc)
                continue
            ended.append(run_id)
        return ended
