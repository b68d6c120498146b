"""Random run lifecycles (Hypothesis stateful testing) against a model of the contract.

Rules drive the real write path: posts, claims, heartbeats, progress events, delegation, cancel
requests, executor confirmations, completion, failure, lease expiry, reconciliation and executor
restarts. A small model predicts each outcome, including the typed error of every invalid move;
a refused move must write nothing. After every step the stored runs must keep the contract's
promises (gapless seqs, one terminal event and it is last, status = last state-changing event,
no completion after a cancel request, intact hash chains).

Defaults are modest; ``SOAK=1`` runs many more and longer lifecycles.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import func, select
from support.factories import make_agent, make_session, post
from support.ledger import STATUS_AFTER_EVENT, TERMINAL_EVENTS, TERMINAL_STATUSES
from support.seeds import SOAK

from agentledger.core.database import Database
from agentledger.core.errors import (
    CancelRequested,
    IllegalTransition,
    LeaseLost,
    LedgerError,
    RunTerminal,
)
from agentledger.core.schema import AgentRun, Message, RunEvent
from ingest.cancel import request_cancel
from ingest.events import append_events
from ingest.history import replay_at
from ingest.leases import claim_runs, heartbeat
from ingest.reconcile import (
    expired_lease_run_ids,
    interrupt_executor_runs,
    interrupt_if_lease_expired,
    interrupt_if_orphaned,
    orphaned_child_run_ids,
)
from ingest.runs import create_child_run
from queries.chain_verification import verify_chains

# The contract's figure is 500 examples × 50 steps on SQLite and 100 × 50 on PostgreSQL; SOAK=1 runs
# five times more. LIFECYCLE_EXAMPLES / LIFECYCLE_STEPS override both.
CI_EXAMPLES = {"sqlite": 500, "postgresql": 100}
SOAK_EXAMPLES = {"sqlite": 2500, "postgresql": 500}
STEPS = int(os.environ.get("LIFECYCLE_STEPS", 50))


def max_examples(dialect: str) -> int:
    if "LIFECYCLE_EXAMPLES" in os.environ:
        return int(os.environ["LIFECYCLE_EXAMPLES"])
    return (SOAK_EXAMPLES if SOAK else CI_EXAMPLES)[dialect]


EXECUTORS = ("w1", "w2")
LEASE = 300  # long enough never to run out by itself during one lifecycle
ACTIVE = ("running", "cancelling")
MAX_RUNS = 7

text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
executors = st.sampled_from(EXECUTORS)
# Executor-side moves mostly come from the lease holder (else nothing would ever complete),
# sometimes from the other executor.
acting = st.sampled_from(["holder", "holder", "holder", "other"])


@dataclass
class ModelRun:
    id: str
    thread: str
    parent: str | None
    status: str = "queued"
    holder: str | None = None
    expired: bool = False
    deltas: list[str] = field(default_factory=list)


class SimulatedClock:
    """The ledger's clock for these lifecycles: it only moves forward, a millisecond per
    transaction, and a lease "expires" by moving it past the lease instead of sleeping."""

    def __init__(self):
        self.now = datetime.now(UTC)

    def tick(self, seconds: float = 0.001) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


class ClockedDatabase:
    """The test database with every transaction stamped by the simulated clock
    (``ingest.history.replay_at``), which every ingest function and lease check reads."""

    def __init__(self, db: Database, clock: SimulatedClock):
        self._db = db
        self.clock = clock

    def __getattr__(self, name):
        return getattr(self._db, name)

    @contextmanager
    def write(self):
        with self._db.write() as s:
            replay_at(s, self.clock.tick())
            yield s

    @contextmanager
    def read(self, **kwargs):
        with self._db.read(**kwargs) as s:
            replay_at(s, self.clock.tick())
            yield s


class Lifecycle(RuleBasedStateMachine):
    db: Database  # set by the test that runs the machine
    seen: Counter  # what the lifecycles did, over all examples

    def tally(self, what: str) -> None:
        self.seen[what] += 1

    def __init__(self):
        super().__init__()
        self.runs: dict[str, ModelRun] = {}
        self.order: list[str] = []
        self.sessions: list[str] = []
        self.may_expire = False
        self.expired_once = False

    # --- helpers --------------------------------------------------------------------------

    def some_active(self) -> bool:
        return any(r.status in ACTIVE for r in self.runs.values())

    def pick(self, data, prefer) -> str:
        """One of the lifecycle's runs, three times likelier to be one in a ``prefer`` status."""
        preferred = [r for r in self.order if self.runs[r].status in prefer]
        return data.draw(st.sampled_from(self.order + preferred * 3), label="run")

    def who(self, run: ModelRun, acting: str) -> str:
        holder = run.holder or EXECUTORS[0]
        return holder if acting == "holder" else next(e for e in EXECUTORS if e != holder)

    def lease_ok(self, run: ModelRun, executor: str) -> bool:
        return run.status in ACTIVE and run.holder == executor and not run.expired

    def fingerprint(self):
        """Row counts plus every modelled run's row: unchanged means nothing was written."""
        with self.db.read() as s:
            totals = tuple(s.execute(select(*(
                select(func.count()).select_from(m).scalar_subquery()
                for m in (AgentRun, Message, RunEvent)))).one())
            rows = s.execute(
                select(AgentRun.id, AgentRun.status, AgentRun.last_event_seq,
                       AgentRun.lease_expires_at, AgentRun.executor_instance_id)
                .where(AgentRun.id.in_(self.order)).order_by(AgentRun.id)
            ).all()
        return totals, [tuple(r) for r in rows]

    def attempt(self, expected_error, fn):
        """Run ``fn`` in a write transaction; if the model expects an error, check it and that
        nothing was written; otherwise return its result."""
        self.tally(expected_error.__name__ if expected_error else "ok")
        if expected_error is None:
            with self.db.write() as s:
                return fn(s)
        before = self.fingerprint()
        with pytest.raises(expected_error), self.db.write() as s:
            fn(s)
        assert self.fingerprint() == before, f"{expected_error.__name__} wrote something"
        return None

    def add_run(self, run_id: str, thread: str, parent: str | None) -> None:
        self.runs[run_id] = ModelRun(run_id, thread, parent)
        self.order.append(run_id)

    def descendants(self, run_id: str) -> list[str]:
        out, frontier = [], [run_id]
        while frontier:
            frontier = [r for r in self.order if self.runs[r].parent in frontier]
            out.extend(frontier)
        return out

    def claimable(self) -> list[str]:
        out = []
        for position, rid in enumerate(self.order):
            run = self.runs[rid]
            if run.status != "queued":
                continue
            if run.parent and self.runs[run.parent].status in TERMINAL_STATUSES:
                continue  # the reconciler's to interrupt (parent_terminal), never to start
            same = [self.runs[o] for o in self.order if self.runs[o].thread == run.thread]
            if any(o.status in ACTIVE for o in same):
                continue
            if any(o.status == "queued" and self.order.index(o.id) < position for o in same):
                continue
            out.append(rid)
        return out

    # --- rules ----------------------------------------------------------------------------

    @initialize(may_expire=st.sampled_from([False, False, False, True]),
                first=st.lists(st.integers(0, 1), min_size=1, max_size=3),
                claim_first=st.integers(0, 3))
    def start(self, may_expire, first, claim_first):
        """Two sessions, one to three messages in them, and usually a claim: every lifecycle
        starts with runs to work on."""
        self.tally("example")
        self.may_expire = may_expire
        self.sessions = [make_session(self.db, title=f"s{i}") for i in range(2)]
        for which in first:
            self.post_message(which, "hello")
        if claim_first:
            self.claim(EXECUTORS[0], claim_first)

    @precondition(lambda self: len(self.order) < MAX_RUNS)
    @rule(which=st.integers(0, 1), content=text)
    def post_message(self, which, content):
        self.tally("post_message")
        posted = post(self.db, self.sessions[which], content or "hi")
        assert not posted.replayed
        self.add_run(posted.run_id, f"session-{which}", None)

    @precondition(lambda self: any(r.status == "queued" for r in self.runs.values()))
    @rule(executor=executors, max_runs=st.integers(1, 3))
    def claim(self, executor, max_runs):
        self.tally("claim")
        expected = self.claimable()[:max_runs]
        with self.db.write() as s:
            got = [c.run_id for c in claim_runs(s, executor, max_runs=max_runs,
                                                lease_seconds=LEASE)]
        assert got == expected
        for rid in got:
            self.runs[rid].status, self.runs[rid].holder = "running", executor

    @precondition(lambda self: self.some_active())
    @rule(data=st.data(), acting=acting)
    def beat(self, data, acting):
        run = self.pick(data, ACTIVE)
        m = self.runs[run]
        executor = self.who(m, acting)
        self.tally("beat")
        error = None if self.lease_ok(m, executor) else LeaseLost
        result = self.attempt(error, lambda s: heartbeat(s, run, executor, lease_seconds=LEASE))
        if result is not None:
            assert result.cancel_requested == (m.status == "cancelling")

    @precondition(lambda self: self.some_active())
    @rule(data=st.data(), acting=acting, texts=st.lists(text, min_size=1, max_size=3),
          tool=st.booleans())
    def progress(self, data, acting, texts, tool):
        run = self.pick(data, ACTIVE)
        m = self.runs[run]
        executor = self.who(m, acting)
        self.tally("progress")
        batch = [("message.delta", {"text": t}) for t in texts]
        if tool:
            batch += [("tool.call", {"name": "lookup", "input": {"q": texts[0]}}),
                      ("usage", {"input_tokens": 1, "output_tokens": len(texts),
                                 "cost_usd": 0.25})]
        error = None if self.lease_ok(m, executor) else LeaseLost
        result = self.attempt(error, lambda s: append_events(s, run, batch,
                                                             executor_instance_id=executor))
        if result is not None:
            assert result.status == m.status
            assert result.cancel_requested == (m.status == "cancelling")
            m.deltas.extend(texts)

    @precondition(lambda self: len(self.order) < MAX_RUNS and self.some_active())
    @rule(data=st.data(), acting=acting)
    def delegate(self, data, acting):
        parent = self.pick(data, ACTIVE)
        m = self.runs[parent]
        executor = self.who(m, acting)
        self.tally("delegate")
        if not self.lease_ok(m, executor):
            error = LeaseLost
        elif m.status == "cancelling":
            error = CancelRequested
        elif m.status != "running":
            error = IllegalTransition
        else:
            error = None
        child = self.attempt(error, lambda s: create_child_run(
            s, parent, agent_id="helper", input="sub task", executor_instance_id=executor))
        if child is not None:
            self.add_run(child, child, parent)

    @rule(data=st.data())
    def cancel(self, data):
        run = self.pick(data, ("queued", "running", "cancelling"))
        self.tally("cancel")
        m = self.runs[run]
        error = RunTerminal if m.status in TERMINAL_STATUSES else None
        status = self.attempt(error, lambda s: request_cancel(s, run, requested_by="alice"))
        if status is None:
            return
        expected = {"queued": "cancelled", "running": "cancelling",
                    "cancelling": "cancelling"}[m.status]
        assert status == expected
        for rid in [run, *self.descendants(run)]:
            r = self.runs[rid]
            r.status = {"queued": "cancelled", "running": "cancelling"}.get(r.status, r.status)

    @precondition(lambda self: self.some_active())
    @rule(data=st.data(), acting=acting)
    def confirm_cancel(self, data, acting):
        run = self.pick(data, ACTIVE)
        m = self.runs[run]
        executor = self.who(m, acting)
        self.tally("confirm_cancel")
        if not self.lease_ok(m, executor):
            error = LeaseLost
        else:
            error = None if m.status == "cancelling" else IllegalTransition
        event = ("run.cancelled", {"external_stop_confirmed": True})
        if self.attempt(error, lambda s: append_events(s, run, [event],
                                                       executor_instance_id=executor)):
            m.status = "cancelled"

    @precondition(lambda self: self.some_active())
    @rule(data=st.data(), acting=acting, content=st.none() | text)
    def complete(self, data, acting, content):
        run = self.pick(data, ACTIVE)
        m = self.runs[run]
        executor = self.who(m, acting)
        self.tally("complete")
        if not self.lease_ok(m, executor):
            error = LeaseLost
        else:
            error = None if m.status == "running" else CancelRequested
        payload = {} if content is None else {"content": content}
        result = self.attempt(error, lambda s: append_events(
            s, run, [("run.completed", payload)], executor_instance_id=executor))
        if result is None:
            return
        m.status = "succeeded"
        with self.db.read() as s:
            answer = s.execute(
                select(Message.content, Message.role, Message.run_id)
                .where(Message.id == result.final_message_id)
            ).one()
            final = s.execute(
                select(AgentRun.final_message_id).where(AgentRun.id == run)
            ).scalar_one()
        assert final == result.final_message_id
        assert tuple(answer) == ("".join(m.deltas) if content is None else content,
                                 "assistant", run)

    @precondition(lambda self: self.some_active())
    @rule(data=st.data(), acting=acting)
    def fail(self, data, acting):
        run = self.pick(data, ACTIVE)
        m = self.runs[run]
        executor = self.who(m, acting)
        self.tally("fail")
        if not self.lease_ok(m, executor):
            error = LeaseLost
        else:
            error = None if m.status == "running" else CancelRequested
        err = {"code": "agent_error", "message": "boom"}
        if self.attempt(error, lambda s: append_events(
                s, run, [("run.failed", {"error": err})], executor_instance_id=executor)):
            m.status = "failed"
            with self.db.read() as s:
                stored = s.execute(select(AgentRun.error).where(AgentRun.id == run)).scalar_one()
            assert stored == err

    @precondition(lambda self: self.some_active())
    @rule(data=st.data(), acting=acting)
    def executor_gives_up(self, data, acting):
        run = self.pick(data, ACTIVE)
        m = self.runs[run]
        executor = self.who(m, acting)
        self.tally("executor_gives_up")
        if not self.lease_ok(m, executor):
            error = LeaseLost
        else:  # a cancelling run is ended by its executor's run.cancelled or by the reconciler
            error = None if m.status == "running" else CancelRequested
        event = ("run.interrupted", {"reason": "executor_shutdown"})
        if self.attempt(error, lambda s: append_events(s, run, [event],
                                                       executor_instance_id=executor)):
            m.status = "interrupted"

    @precondition(lambda self: self.may_expire and not self.expired_once and any(
        r.status in ACTIVE and not r.expired for r in self.runs.values()))
    @rule(data=st.data())
    def expire_lease(self, data):
        live = [r for r in self.order
                if self.runs[r].status in ACTIVE and not self.runs[r].expired]
        run = data.draw(st.sampled_from(live))
        m = self.runs[run]
        with self.db.write() as s:
            heartbeat(s, run, m.holder, lease_seconds=1)
        self.db.clock.tick(1.05)
        self.tally("lease expired")
        m.expired = True
        self.expired_once = True

    @precondition(lambda self: any(r.status not in TERMINAL_STATUSES for r in self.runs.values()))
    @rule()
    def reconcile(self):
        self.tally("reconcile")
        expected_expired = {r for r in self.order
                            if self.runs[r].status in ACTIVE and self.runs[r].expired}
        with self.db.read() as s:
            found = expired_lease_run_ids(s)
        ended = set()
        for rid in found:
            with self.db.write() as s:
                if interrupt_if_lease_expired(s, rid):
                    ended.add(rid)
        assert ended == expected_expired
        if ended:
            self.tally("lease_expired interrupts")
        for rid in ended:
            self.runs[rid].status = "interrupted"
        expected_orphans = {
            r for r in self.order
            if self.runs[r].status == "queued" and self.runs[r].parent
            and self.runs[self.runs[r].parent].status in TERMINAL_STATUSES
        }
        with self.db.read() as s:
            found = orphaned_child_run_ids(s)
        dropped = set()
        for rid in found:
            with self.db.write() as s:
                if interrupt_if_orphaned(s, rid):
                    dropped.add(rid)
        assert dropped == expected_orphans
        if dropped:
            self.tally("parent_terminal interrupts")
        for rid in dropped:
            self.runs[rid].status = "interrupted"

    @precondition(lambda self: any(r.status in ACTIVE for r in self.runs.values()))
    @rule(executor=executors)
    def restart_executor(self, executor):
        self.tally("restart_executor")
        expected = {r for r in self.order
                    if self.runs[r].holder == executor and self.runs[r].status in ACTIVE}
        with self.db.write() as s:
            ended = set(interrupt_executor_runs(s, executor, reason="service_restart"))
        assert ended == expected
        for rid in ended:
            self.runs[rid].status = "interrupted"

    # --- what must hold after every step ----------------------------------------------------

    @invariant()
    def stored_runs_keep_the_contract(self):
        self.tally("step")
        if not self.order:
            return
        with self.db.read() as s:
            rows = {r.id: r for r in s.execute(
                select(AgentRun.id, AgentRun.status, AgentRun.last_event_seq,
                       AgentRun.finished_at, AgentRun.final_message_id)
                .where(AgentRun.id.in_(self.order)))}
            stored: dict[str, list] = {rid: [] for rid in self.order}
            for e in s.execute(select(RunEvent.run_id, RunEvent.seq, RunEvent.type)
                               .where(RunEvent.run_id.in_(self.order))
                               .order_by(RunEvent.run_id, RunEvent.seq)):
                stored[e.run_id].append(e)
            report = verify_chains(s, run_ids=self.order)
            assert report.ok and report.runs_checked == len(self.order), report
        for rid in self.order:
            run, evs = rows[rid], stored[rid]
            types = [e.type for e in evs]
            assert run.status == self.runs[rid].status, (rid, types)
            assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
            assert run.last_event_seq == len(evs)
            assert types[0] == "run.queued"
            ends = [i for i, t in enumerate(types) if t in TERMINAL_EVENTS]
            assert len(ends) <= 1, types
            assert not ends or ends[0] == len(types) - 1, types
            changing = [t for t in types if t in STATUS_AFTER_EVENT]
            assert run.status == STATUS_AFTER_EVENT[changing[-1]], types
            if "run.cancelling" in changing:
                tail = changing[changing.index("run.cancelling"):]
                assert "run.completed" not in tail and "run.failed" not in tail, types
            assert (run.finished_at is not None) == (run.status in TERMINAL_STATUSES)
            assert (run.final_message_id is not None) == (run.status == "succeeded")

    def teardown(self):
        """End every run this lifecycle left open, so the next one starts with a clean queue."""
        if not self.order:
            return
        with self.db.read() as s:
            open_runs = dict(s.execute(
                select(AgentRun.id, AgentRun.status)
                .where(AgentRun.id.in_(self.order), AgentRun.status.in_(ACTIVE))).all())
        for rid in open_runs:
            try:
                with self.db.write() as s:
                    append_events(s, rid, [("run.interrupted", {"reason": "executor_shutdown"})])
            except LedgerError:
                pass
        with self.db.read() as s:
            queued = s.execute(select(AgentRun.id).where(
                AgentRun.id.in_(self.order), AgentRun.status == "queued")).scalars().all()
        for rid in queued:
            try:
                with self.db.write() as s:
                    request_cancel(s, rid, requested_by="teardown")
            except LedgerError:  # already ended by an earlier cascade
                pass


# The budget is the example count; on a slow or busy machine 25,000 checked steps take minutes,
# and pytest-timeout's default is for hangs, not for a test of this size.
@pytest.mark.timeout(1800)
def test_random_lifecycles_keep_the_contract(db, soak_loop):
    make_agent(db, "echo")
    make_agent(db, "helper")

    class Machine(Lifecycle):
        pass

    Machine.db = ClockedDatabase(db, SimulatedClock())
    Machine.seen = Counter()
    started = time.monotonic()
    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=max_examples(db.dialect),
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    seen = Machine.seen
    assert seen["ok"] and seen["claim"] and seen["LeaseLost"] and seen["RunTerminal"], seen
    elapsed = time.monotonic() - started
    # The budget is the example count chosen up front; the duration is reported, not judged.
    print(f"lifecycle {db.dialect}: {max_examples(db.dialect)} examples × {STEPS} steps "
          f"in {elapsed:.0f}s")
