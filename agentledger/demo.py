"""Demo data: realistic history written through the real ingest path (``ingest.history``).

Agents with 2-3 versions, sessions of several owners that switch agents, delegation trees up to
depth 3, failures, cancels, interruptions of every reason, token usage and cost, spread over the
last N days. Each run's whole life is one transaction, so a live worker never sees (or claims)
a half-imported run.
"""

from __future__ import annotations

import os
import random
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.errors import Conflict
from agentledger.core.progress import progress as progress_of
from agentledger.demo_history import (
    AGENTS,
    CONTEXT_DOCS,
    EXECUTORS,
    LEASE,
    OWNERS,
    TOPICS,
    VersionTimeline,
    definition,
    showcase_plan,
    synthetic_shares,
)
from agentledger.demo_history import (
    outcome as pick_outcome,
)
from ingest.agents import add_agent_version, register_agent
from ingest.bulk_import import ImportReport, bulk_import_shares
from ingest.cancel import request_cancel
from ingest.events import append_events
from ingest.history import replay_at
from ingest.leases import claim_run, heartbeat
from ingest.reconcile import (
    interrupt_executor_runs,
    interrupt_if_lease_expired,
    interrupt_if_orphaned,
)
from ingest.runs import ContextItem, create_child_run, post_message, request_checksum
from ingest.sessions import create_session, update_session
from queries.agents_catalog import version_times


def _ensure_agents(db: Database, start: datetime, days: int) -> dict[str, list[datetime]]:
    """Register every agent at ``start`` and schedule its later versions over the window."""
    schedule: dict[str, list[datetime]] = {}
    for agent_id, versions in AGENTS.items():
        with db.write() as s:
            replay_at(s, start)
            try:
                register_agent(s, agent_id, definition(agent_id, 1))
            except Conflict:
                schedule[agent_id] = []
                continue
        step = timedelta(days=days / len(versions))
        schedule[agent_id] = [start + step * i for i in range(1, len(versions))]
    return schedule


class _Replayer:
    def __init__(self, s: Session, rng: random.Random, at: datetime):
        self.s, self.rng, self.at = s, rng, at

    def tick(self, low: float, high: float) -> datetime:
        self.at += timedelta(seconds=self.rng.uniform(low, high))
        replay_at(self.s, self.at)
        return self.at

    def work(self, run_id: str, executor: str, topic: str) -> None:
        """Progress events of a healthy run: a tool call, some text, usage."""
        rng = self.rng
        if rng.random() < 0.7:
            self.tick(0.2, 2)
            append_events(self.s, run_id, [
                ("tool.call", {"name": "search", "input": {"query": topic}}),
                ("tool.result", {"name": "search", "output": {"hits": rng.randint(1, 12)}}),
            ], executor_instance_id=executor)
        for part in (f"Looked into {topic}. ", "Here is what I found: ", "all checks pass."):
            self.tick(0.1, 1.5)
            append_events(self.s, run_id, [("message.delta", {"text": part})],
                          executor_instance_id=executor)
        self.tick(0.05, 0.3)
        tokens_in, tokens_out = rng.randint(300, 6000), rng.randint(80, 1500)
        append_events(self.s, run_id, [("usage", {
            "input_tokens": tokens_in, "output_tokens": tokens_out,
            "cost_usd": round(tokens_in * 2.5e-6 + tokens_out * 1e-5, 6)})],
            executor_instance_id=executor)

    def execute(self, run_id: str, outcome: str, depth: int, topic: str) -> None:
        rng = self.rng
        executor = rng.choice(EXECUTORS)
        self.tick(0.05, 4)
        claim_run(self.s, run_id, executor, lease_seconds=LEASE)
        if depth > 0:
            kids = []
            for agent_id in rng.sample(["web-search", "summarizer", "code-reviewer"], rng.randint(1, 2)):
                self.tick(0.1, 0.5)
                kids.append(create_child_run(self.s, run_id, agent_id=agent_id,
                                             input=f"{agent_id}: {topic}",
                                             executor_instance_id=executor))
            for kid in kids:
                kid_outcome = "failed" if rng.random() < 0.08 else "succeeded"
                self.execute(kid, kid_outcome, depth - 1, topic)
            self.tick(0.1, 1)
            heartbeat(self.s, run_id, executor, lease_seconds=LEASE)
        if outcome in ("succeeded", "failed", "cancelled"):
            self.work(run_id, executor, topic)
        if outcome == "succeeded":
            self.tick(0.05, 0.5)
            append_events(self.s, run_id, [("run.completed", {})], executor_instance_id=executor)
        elif outcome == "failed":
            self.tick(0.05, 0.5)
            code, message = rng.choice([("rate_limited", "model provider returned 429 three times"),
                                        ("tool_error", "search backend timed out"),
                                        ("agent_error", "could not parse the model's tool call")])
            append_events(self.s, run_id, [("run.failed", {"error": {"code": code, "message": message}})],
                          executor_instance_id=executor)
        elif outcome == "cancelled":
            self.tick(0.5, 5)
            request_cancel(self.s, run_id, requested_by="demo-user")
            self.tick(0.1, 0.9)
            append_events(self.s, run_id, [("run.cancelled", {"external_stop_confirmed": True})],
                          executor_instance_id=executor)
        elif outcome == "lease_expired":
            self.tick(1, 5)
            self.tick(LEASE + 1, LEASE + 15)
            interrupt_if_lease_expired(self.s, run_id)
        elif outcome in ("service_restart", "executor_shutdown"):
            self.tick(1, 10)
            interrupt_executor_runs(self.s, executor, reason=outcome)


BULK_THRESHOLD = 2000


def _all_versions_registered(db: Database, start: datetime, days: int) -> VersionTimeline:
    """Register every agent and all its versions (at their scheduled moments, through
    ``ingest.agents``); the timeline says which version was current when."""
    due = _ensure_agents(db, start, days)
    for moment, agent_id in sorted((m, a) for a, moments in due.items() for m in moments):
        with db.write() as s:
            replay_at(s, moment)
            add_agent_version(s, agent_id, definition(agent_id, len(AGENTS[agent_id]) - len(due[agent_id]) + 1))
        due[agent_id].pop(0)
    with db.read(primary=True) as s:
        rows = version_times(s)
    since: dict[str, list[tuple[datetime, int]]] = {}
    for agent_id, version, created in rows:
        since.setdefault(agent_id, []).append((created, version))
    return VersionTimeline(since)


def _default_workers(db: Database) -> int:
    """One preparing process per CPU (up to 4): each builds its share's trees and rows, and
    this process only writes them (a small share of the work, so it needs no CPU of its
    own: on 2 CPUs two workers loaded 44,000 events/s where one loaded 39,000)."""
    cpus = os.cpu_count() or 1
    if cpus == 1 or (db.url.startswith("sqlite") and ":memory:" in db.url):
        return 0
    return min(4, cpus)


def bulk_seed(settings: Settings, *, runs: int, days: int = 14, seed: int | None = None,
              progress: bool = False, now: datetime | None = None,
              batch_runs: int = 2000, workers: int | None = None) -> ImportReport:
    """Synthetic history written by the bulk import (see ``agentledger.demo_history``).

    ``workers``: processes building and preparing batches while this one writes them; by
    default one per CPU (up to 4), none on a one-CPU machine or an in-memory database."""
    if runs < 1 or days < 1:
        raise ValueError("runs and days must be at least 1")
    now = now or datetime.now(UTC)
    start = now - timedelta(days=days)
    db = Database(settings.database_url, redaction_rules=settings.redaction_rules())
    try:
        timeline = _all_versions_registered(db, start, days)
        # one share per batch, built in the process that prepares it (a root brings about
        # 1.9 runs with its children, so a share of batch_runs / 1.4 roots writes ~2,700)
        shares = synthetic_shares(runs=runs, start=start, days=days, versions=timeline,
                                  seed=seed, roots_per_share=max(1, batch_runs * 5 // 7))
        with progress_of(runs, unit="run", desc="demo seed (bulk)", enabled=progress) as bar:
            return bulk_import_shares(db, shares, progress=bar.update,
                                      workers=_default_workers(db) if workers is None else workers)
    finally:
        db.dispose()


def seed(settings: Settings, *, runs: int = 300, days: int = 14, seed: int | None = None,
         progress: bool = False, now: datetime | None = None) -> int:
    """Write ``runs`` root runs (plus their delegated children); returns the number of roots.

    Up to ``BULK_THRESHOLD`` runs each run's life is replayed through the live ingest functions
    (one transaction per run); above it the history is generated as ``ImportedRun`` trees and
    written by ``ingest.bulk_import`` (COPY on PostgreSQL), about a hundred times faster.
    """
    if runs < 1 or days < 1:
        raise ValueError("runs and days must be at least 1")
    if runs > BULK_THRESHOLD:
        bulk_seed(settings, runs=runs, days=days, seed=seed, progress=progress, now=now)
        return runs
    rng = random.Random(seed)
    now = now or datetime.now(UTC)
    start = now - timedelta(days=days)
    db = Database.from_settings(settings)
    try:
        versions_due = _ensure_agents(db, start, days)
        moments = sorted(start + timedelta(seconds=rng.uniform(60, days * 86400 - 600))
                         for _ in range(runs))
        # Rare cases are left to chance only when there are too few runs to show them all: any
        # seed of 14 runs or more has every terminal status, every interruption reason and
        # a delegation tree of depth 3.
        forced = showcase_plan(rng, runs)
        sessions: list[tuple[str, str]] = []
        bar = progress_of(runs, unit="run", desc="demo seed", enabled=progress)
        for index, at in enumerate(moments):
            with db.write() as s:
                replayer = _Replayer(s, rng, at)
                replay_at(s, at)
                for agent_id, due in versions_due.items():
                    while due and due[0] <= at:
                        add_agent_version(s, agent_id, definition(agent_id, len(AGENTS[agent_id]) - len(due) + 1))
                        due.pop(0)
                if not sessions or rng.random() < 0.3:
                    owner = rng.choice(OWNERS)
                    agent = rng.choice(["support-bot", "researcher", "code-reviewer", "echo"])
                    sessions.append((create_session(s, owner_id=owner, agent_id=agent,
                                                    title=f"About {rng.choice(TOPICS)}"), owner))
                session_id, owner = rng.choice(sessions[-8:])
                if rng.random() < 0.1:
                    update_session(s, session_id, owner_id=None,
                                   agent_id=rng.choice(["support-bot", "researcher", "code-reviewer"]))
                topic = rng.choice(TOPICS)
                agent_override = "researcher" if rng.random() < 0.25 else None
                if agent_override is None and rng.random() < 0.1:
                    agent_override = rng.choice(["summarizer", "echo"])
                showcase = forced.get(index)
                if showcase in ("deep_tree", "parent_terminal"):
                    agent_override = "researcher"  # the agent that delegates
                docs = rng.sample(CONTEXT_DOCS, rng.randint(0, 2))
                body = {"content": f"Can you help with {topic}?", "n": index}
                posted = post_message(
                    s, owner_id=owner, session_id=session_id,
                    idempotency_key=f"demo-{seed}-{index}-{at.timestamp()}",
                    checksum=request_checksum(f"/api/sessions/{session_id}/messages", body),
                    content=body["content"], agent_id=agent_override,
                    context=[ContextItem(d, t, f"{t}: text of {d} as of {at:%Y-%m-%d}", 1 + index % 3)
                             for d, t in docs],
                )
                outcome = pick_outcome(rng)
                depth = 0
                if posted.agent_id == "researcher":
                    depth = rng.choice([1, 1, 2])
                if showcase == "deep_tree":
                    outcome, depth = "succeeded", 2
                elif showcase is not None and showcase != "parent_terminal":
                    outcome = showcase
                if showcase == "parent_terminal" or (
                    showcase is None and depth and outcome == "failed" and rng.random() < 0.5
                ):
                    _orphan_tree(replayer, posted.run_id, topic)
                else:
                    replayer.execute(posted.run_id, outcome, depth, topic)
            bar.update(1)
        bar.close()
        return runs
    finally:
        db.dispose()


def _orphan_tree(replayer: _Replayer, run_id: str, topic: str) -> None:
    """A parent that fails while its child is still queued: the child ends parent_terminal."""
    s, executor = replayer.s, replayer.rng.choice(EXECUTORS)
    replayer.tick(0.05, 2)
    claim_run(s, run_id, executor, lease_seconds=LEASE)
    replayer.tick(0.1, 0.5)
    child = create_child_run(s, run_id, agent_id="web-search", input=topic, executor_instance_id=executor)
    replayer.tick(0.1, 0.5)
    append_events(s, run_id, [("run.failed", {"error": {"code": "agent_error",
                                                        "message": "planner crashed after delegating"}})],
                  executor_instance_id=executor)
    replayer.tick(1, 5)
    interrupt_if_orphaned(s, child)


def seed_command(settings: Settings, *, runs: int, days: int, seed: int | None) -> int:
    """``agentledger demo seed``."""
    from agentledger.core.migrate import upgrade

    upgrade(settings.database_url)
    if runs > BULK_THRESHOLD:
        report = bulk_seed(settings, runs=runs, days=days, seed=seed, progress=True)
        print(f"bulk import: {report.runs} runs, {report.events} events, {report.messages} "
              f"messages in {report.seconds:.1f} s ({report.runs_per_second:,.0f} runs/s, "
              f"{report.events_per_second:,.0f} events/s)")
        written = runs
    else:
        written = globals()["seed"](settings, runs=runs, days=days, seed=seed, progress=True)
    print(f"seeded {written} root runs over {days} days into {settings.database_url.split('@')[-1]}")
    return 0
