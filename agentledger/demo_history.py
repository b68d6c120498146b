"""The vocabulary of demo history, and a fast generator of synthetic history for bulk import.

``agentledger.demo`` replays small histories through the live ingest functions with this
vocabulary; ``synthetic_history`` describes large ones as ``ingest.bulk_import.ImportedRun``
trees (agents with versions, sessions of several owners that switch agents, delegation trees up
to depth 3, every terminal status and interruption reason, ~10 events per run, usage with tokens
and cost, spread over N days) for ``bulk_import`` — the path ``agentledger demo seed --runs N``
takes for large N, and the benchmark's loader.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from ingest.agents import AgentDefinition
from ingest.bulk_import import ImportedEvent, ImportedRun, ImportedSession
from ingest.runs import ContextItem

LEASE = 120  # seconds; replayed heartbeats renew it like a live executor would
OWNERS = ("alice", "bob", "carol", "dave", "erin")
EXECUTORS = ("worker-eu-1", "worker-eu-2", "worker-us-1")

# agent id -> list of (name, kind, model) per version, oldest first
AGENTS = {
    "support-bot": [("Support Bot", "scripted", "gpt-4o-mini"),
                    ("Support Bot", "scripted", "gpt-4o"),
                    ("Support Bot Pro", "scripted", "gpt-4.1")],
    "researcher": [("Researcher", "scripted", "claude-3-5-sonnet"),
                   ("Deep Researcher", "scripted", "claude-sonnet-4")],
    "web-search": [("Web Search", "scripted", "tool-only"),
                   ("Web Search", "scripted", "tool-only-v2")],
    "summarizer": [("Summarizer", "scripted", "gpt-4o-mini"),
                   ("Summarizer", "scripted", "gpt-4.1-mini"),
                   ("Brief Writer", "scripted", "gpt-4.1-mini")],
    "code-reviewer": [("Code Reviewer", "scripted", "o3-mini"),
                      ("Code Reviewer", "scripted", "o4-mini")],
    "echo": [("Echo", "echo", None), ("Echo", "echo", None)],
}
SESSION_AGENTS = ("support-bot", "researcher", "code-reviewer", "echo")
SWITCH_AGENTS = ("support-bot", "researcher", "code-reviewer")
CHILD_AGENTS = ("web-search", "summarizer", "code-reviewer")
TOPICS = ("refund policy", "latency spike in eu-west", "Q3 churn numbers", "the onboarding flow",
          "PR #4821 (retry logic)", "GDPR export request", "pricing page copy", "an outage postmortem",
          "the SSO migration", "invoice INV-2231")
CONTEXT_DOCS = (("kb-refunds", "Refund policy"), ("kb-sla", "Support SLA"),
                ("runbook-latency", "Latency runbook"), ("style-guide", "Writing style guide"))
FAILURES = (("rate_limited", "model provider returned 429 three times"),
            ("tool_error", "search backend timed out"),
            ("agent_error", "could not parse the model's tool call"))

# Each of these appears at least once in any seed with enough runs.
SHOWCASE = ("failed", "cancelled", "lease_expired", "service_restart", "executor_shutdown",
            "parent_terminal", "deep_tree")


def definition(agent_id: str, version: int) -> AgentDefinition:
    name, kind, model = AGENTS[agent_id][version - 1]
    return AgentDefinition(
        name=name, kind=kind, model=model,
        instructions=f"You are {name} (v{version}). Be accurate and cite the context pack.",
        tools=[{"name": "search"}, {"name": "fetch"}] if agent_id in ("researcher", "web-search") else [],
        params={"steps": [{"say": "Working on: {input}"}]} if kind == "scripted" else {},
    )


def outcome(rng: random.Random) -> str:
    """succeeded | failed | cancelled | lease_expired | service_restart | executor_shutdown."""
    roll = rng.random()
    for limit, result in ((0.74, "succeeded"), (0.83, "failed"), (0.89, "cancelled"),
                          (0.94, "lease_expired"), (0.97, "service_restart")):
        if roll < limit:
            return result
    return "executor_shutdown"


def showcase_plan(rng: random.Random, runs: int) -> dict[int, str]:
    """Which run indexes are forced to show the rare cases (when there are enough runs)."""
    if runs < 2 * len(SHOWCASE):
        return {}
    return dict(zip(rng.sample(range(runs), len(SHOWCASE)), SHOWCASE, strict=True))


@dataclass(frozen=True)
class VersionTimeline:
    """When each version of each agent became current: runs freeze the one current then."""

    since: dict[str, list[tuple[datetime, int]]]  # agent id -> [(from, version)], oldest first

    def at(self, agent_id: str, moment: datetime) -> int:
        current = 1
        for since, version in self.since.get(agent_id, ()):
            if since <= moment:
                current = version
            else:
                break
        return current


class _Builder:
    """Builds one root run's tree, with times that move forward like a real execution."""

    def __init__(self, rng: random.Random, versions: VersionTimeline):
        self.rng, self.versions = rng, versions
        self.at: datetime

    def tick(self, low: float, high: float) -> datetime:
        self.at = self.at + timedelta(seconds=self.rng.uniform(low, high))
        return self.at

    def run(self, agent_id: str, text: str, outcome_: str, depth: int, topic: str, *,
            created: datetime, session=None, context=(), orphan: bool = False) -> ImportedRun:
        rng = self.rng
        run = ImportedRun(agent_id=agent_id, agent_version=self.versions.at(agent_id, created),
                          input=text, created_at=created, events=[], session=session,
                          context=list(context))
        ev = run.events

        def add(type_: str, data: dict) -> None:
            ev.append(ImportedEvent(type_, data, self.at))

        self.at = created
        executor = rng.choice(EXECUTORS)
        self.tick(0.05, 4)
        lease = self.at + timedelta(seconds=LEASE)
        add("run.started", {"executor_instance_id": executor, "lease_expires_at": lease.isoformat()})
        if orphan:  # delegates, then fails while its child is still queued
            self.tick(0.1, 0.5)
            child = self.queued_child("web-search", topic)
            add("run.child_created", {"child_run_id": child.id, "agent_id": "web-search"})
            self.tick(0.1, 0.5)
            add("run.failed", {"error": {"code": "agent_error",
                                         "message": "planner crashed after delegating"}})
            self.at = self.at + timedelta(seconds=rng.uniform(1, 5))
            child.events.append(ImportedEvent("run.interrupted", {
                "reason": "parent_terminal", "parent_run_id": run.id}, self.at))
            run.children.append(child)
            run.lease_expires_at = lease
            return run
        if depth > 0:
            for child_agent in rng.sample(CHILD_AGENTS, rng.randint(1, 2)):
                self.tick(0.1, 0.5)
                kid_outcome = "failed" if rng.random() < 0.08 else "succeeded"
                child_created = self.at
                parent_at = self.at
                child = self.run(child_agent, f"{child_agent}: {topic}", kid_outcome, depth - 1,
                                 topic, created=child_created)
                ev.append(ImportedEvent("run.child_created",
                                        {"child_run_id": child.id, "agent_id": child_agent},
                                        parent_at))
                ev.append(ImportedEvent("run.child_finished",
                                        {"child_run_id": child.id,
                                         "status": "succeeded" if kid_outcome == "succeeded" else "failed"},
                                        self.at))
                run.children.append(child)
            self.tick(0.1, 1)
            lease = self.at + timedelta(seconds=LEASE)  # a heartbeat renewed it
            run.last_heartbeat_at = self.at
        if outcome_ in ("succeeded", "failed", "cancelled"):
            if rng.random() < 0.7:
                self.tick(0.2, 2)
                add("tool.call", {"name": "search", "input": {"query": topic}})
                add("tool.result", {"name": "search", "output": {"hits": rng.randint(1, 12)}})
            for part in (f"Looked into {topic}. ", "Here is what I found: ", "all checks pass."):
                self.tick(0.1, 1.5)
                add("message.delta", {"text": part})
            self.tick(0.05, 0.3)
            tokens_in, tokens_out = rng.randint(300, 6000), rng.randint(80, 1500)
            add("usage", {"input_tokens": tokens_in, "output_tokens": tokens_out,
                          "cost_usd": round(tokens_in * 2.5e-6 + tokens_out * 1e-5, 6)})
        if outcome_ == "succeeded":
            self.tick(0.05, 0.5)
            add("run.completed", {})
        elif outcome_ == "failed":
            self.tick(0.05, 0.5)
            code, message = rng.choice(FAILURES)
            add("run.failed", {"error": {"code": code, "message": message}})
        elif outcome_ == "cancelled":
            self.tick(0.5, 5)
            add("run.cancelling", {"requested_by": "demo-user"})
            self.tick(0.1, 0.9)
            add("run.cancelled", {"external_stop_confirmed": True})
        elif outcome_ == "lease_expired":
            self.tick(1, 5)
            self.at = max(self.at, lease) + timedelta(seconds=rng.uniform(1, 15))
            add("run.interrupted", {"reason": "lease_expired", "executor_instance_id": executor,
                                    "lease_expires_at": lease.isoformat()})
        else:  # service_restart | executor_shutdown
            self.tick(1, 10)
            add("run.interrupted", {"reason": outcome_, "executor_instance_id": executor})
        run.lease_expires_at = lease
        return run

    def queued_child(self, agent_id: str, topic: str) -> ImportedRun:
        return ImportedRun(agent_id=agent_id, agent_version=self.versions.at(agent_id, self.at),
                           input=topic, created_at=self.at, events=[])


ROOTS_PER_SHARE = 1400  # about 2,700 runs with their children: one bulk import batch


@dataclass(frozen=True)
class SyntheticShare:
    """Root runs ``first`` to ``last - 1`` of a synthetic history, built on call (in the
    process that prepares their batch: see ``ingest.bulk_import.BulkImporter.run_shares``).
    Its sessions are its own; its random stream is seeded from the history's seed and
    ``first``, so the same seed gives the same history."""

    first: int
    last: int
    start: datetime
    step: float
    versions: VersionTimeline
    forced: dict[int, str]  # run index -> showcase case, for this share's indexes
    seed: int | None

    def __call__(self) -> list[ImportedRun]:
        rng = random.Random(None if self.seed is None else f"{self.seed}:{self.first}")
        builder = _Builder(rng, self.versions)
        sessions: list[ImportedSession] = []
        trees = []
        for index in range(self.first, self.last):
            trees.append(self._root(rng, builder, sessions, index))
        return trees

    def _root(self, rng: random.Random, builder: _Builder, sessions: list[ImportedSession],
              index: int) -> ImportedRun:
        # evenly spread with jitter, in order: a stream, not a list sorted in memory
        at = self.start + timedelta(seconds=60 + self.step * index + rng.uniform(0, self.step))
        if not sessions or rng.random() < 0.3:
            sessions.append(ImportedSession(owner_id=rng.choice(OWNERS),
                                            agent_id=rng.choice(SESSION_AGENTS),
                                            created_at=at - timedelta(seconds=1),
                                            title=f"About {rng.choice(TOPICS)}"))
            del sessions[:-8]
        chat = rng.choice(sessions)
        if rng.random() < 0.1:  # the user switches the session's default agent
            chat.agent_id = rng.choice(SWITCH_AGENTS)
            chat.updated_at = at
        topic = rng.choice(TOPICS)
        agent_id = chat.agent_id
        if rng.random() < 0.25:
            agent_id = "researcher"
        elif rng.random() < 0.1:
            agent_id = rng.choice(["summarizer", "echo"])
        showcase = self.forced.get(index)
        if showcase in ("deep_tree", "parent_terminal"):
            agent_id = "researcher"
        result = outcome(rng)
        depth = rng.choice([1, 1, 2]) if agent_id == "researcher" else 0
        if showcase == "deep_tree":
            result, depth = "succeeded", 2
        elif showcase is not None and showcase != "parent_terminal":
            result = showcase
        orphan = showcase == "parent_terminal" or (
            showcase is None and depth > 0 and result == "failed" and rng.random() < 0.5)
        docs = rng.sample(CONTEXT_DOCS, rng.randint(0, 2))
        context = [ContextItem(d, t, f"{t}: text of {d} as of {at:%Y-%m-%d}", 1 + index % 3)
                   for d, t in docs]
        return builder.run(agent_id, f"Can you help with {topic}?", result, depth, topic,
                           created=at, session=chat, context=context, orphan=orphan)


def synthetic_shares(
    *, runs: int, start: datetime, days: int, versions: VersionTimeline,
    seed: int | None = None, roots_per_share: int = ROOTS_PER_SHARE,
) -> Iterator[SyntheticShare]:
    """``runs`` root runs (plus their children) created over ``days`` days from ``start``,
    oldest first, as shares of ``roots_per_share`` root runs for
    ``ingest.bulk_import.bulk_import_shares``. The agents of ``AGENTS`` must be registered."""
    if roots_per_share < 1:
        raise ValueError("roots_per_share must be at least 1")
    forced = showcase_plan(random.Random(seed), runs)
    step = (days * 86400 - 600 - 60) / max(runs, 1)
    for first in range(0, runs, roots_per_share):
        last = min(runs, first + roots_per_share)
        yield SyntheticShare(first, last, start, step, versions,
                             {i: case for i, case in forced.items() if first <= i < last}, seed)


def synthetic_history(
    *, runs: int, start: datetime, days: int, versions: VersionTimeline,
    seed: int | None = None,
) -> Iterator[ImportedRun]:
    """The trees of ``synthetic_shares``, one after another (for ``bulk_import``)."""
    for share in synthetic_shares(runs=runs, start=start, days=days, versions=versions,
                                  seed=seed):
        yield from share()
