"""How does each agent, and each version of it, turn out?

For runs created in a window: counts and rates by terminal status, latency percentiles (p50,
p95, p99 of started → finished, for runs that ran and ended), queue wait (created → started),
tokens and cost summed from ``usage`` events, and the trend per day. A run counts under the
agent version frozen in its snapshot (``agent_run.agent_version``), so comparing versions
compares what each really did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Float, and_, cast, func, select
from sqlalchemy.orm import Session

from agentledger.schema import NON_TERMINAL, TERMINAL, Agent, AgentRun, AgentVersion, RunEvent
from queries import _dialect
from queries.common import TimeWindow, iso

DAY = 86400
MAX_GROUPS = 2000
MAX_TREND_ROWS = 5000


@dataclass(frozen=True)
class Outcome:
    """One agent (``version`` None: all its versions together) or one agent version."""

    agent_id: str
    version: int | None
    name: str | None
    runs: int
    by_status: dict[str, int]
    latency_p50: float | None = None
    latency_p95: float | None = None
    latency_p99: float | None = None
    latency_mean: float | None = None
    queue_wait_p50: float | None = None
    queue_wait_p95: float | None = None
    queue_wait_mean: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def finished(self) -> int:
        return sum(self.by_status.get(s, 0) for s in TERMINAL)

    @property
    def unfinished(self) -> int:
        return sum(self.by_status.get(s, 0) for s in NON_TERMINAL)

    @property
    def rates(self) -> dict[str, float | None]:
        """Share of each terminal status among the finished runs (None when none finished)."""
        done = self.finished
        return {s: (self.by_status.get(s, 0) / done if done else None) for s in TERMINAL}

    def as_dict(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "version": self.version,
            "name": self.name,
            "runs": self.runs,
            "finished": self.finished,
            "unfinished": self.unfinished,
            "by_status": self.by_status,
            "rates": self.rates,
            "latency_p50": self.latency_p50,
            "latency_p95": self.latency_p95,
            "latency_p99": self.latency_p99,
            "latency_mean": self.latency_mean,
            "queue_wait_p50": self.queue_wait_p50,
            "queue_wait_p95": self.queue_wait_p95,
            "queue_wait_mean": self.queue_wait_mean,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
        }


@dataclass(frozen=True)
class AgentOutcomes:
    agents: list[Outcome]
    versions: list[Outcome]
    percentiles_truncated: bool = False

    def versions_of(self, agent_id: str) -> list[Outcome]:
        return [v for v in self.versions if v.agent_id == agent_id]

    def version(self, agent_id: str, version: int) -> Outcome | None:
        return next((v for v in self.versions if v.agent_id == agent_id and v.version == version), None)


@dataclass
class _Acc:
    runs: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    latency_sum: float = 0.0
    latency_n: int = 0
    wait_sum: float = 0.0
    wait_n: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


def _conditions(window: TimeWindow, agent_id: str | None) -> list:
    found = window.conditions(AgentRun.created_at)
    if agent_id is not None:
        found.append(AgentRun.agent_id == agent_id)
    return found


def agent_outcomes(
    session: Session, window: TimeWindow, *, agent_id: str | None = None
) -> AgentOutcomes:
    where = _conditions(window, agent_id)
    latency = _dialect.seconds_between(session, AgentRun.started_at, AgentRun.finished_at)
    wait = _dialect.seconds_between(session, AgentRun.created_at, AgentRun.started_at)
    ended = AgentRun.status.in_(TERMINAL)

    # 1. Counts, and sums for the means, per (agent, version, status).
    counted = session.execute(
        select(
            AgentRun.agent_id, AgentRun.agent_version, AgentRun.status,
            func.count().label("runs"),
            func.sum(latency).label("latency_sum"), func.count(latency).label("latency_n"),
            func.sum(wait).label("wait_sum"), func.count(wait).label("wait_n"),
        )
        .where(*where)
        .group_by(AgentRun.agent_id, AgentRun.agent_version, AgentRun.status)
        .limit(MAX_GROUPS)
    ).all()
    # 2. Tokens and cost from usage events (primary-key range per run).
    usage = session.execute(
        select(
            AgentRun.agent_id, AgentRun.agent_version,
            func.sum(RunEvent.data["input_tokens"].as_integer()).label("input_tokens"),
            func.sum(RunEvent.data["output_tokens"].as_integer()).label("output_tokens"),
            func.sum(cast(RunEvent.data["cost_usd"].as_float(), Float)).label("cost_usd"),
        )
        .join(RunEvent, and_(RunEvent.run_id == AgentRun.id, RunEvent.type == "usage"))
        .where(*where)
        .group_by(AgentRun.agent_id, AgentRun.agent_version)
        .limit(MAX_GROUPS)
    ).all()

    versions: dict[tuple[str, int], _Acc] = {}
    for r in counted:
        acc = versions.setdefault((r.agent_id, r.agent_version), _Acc())
        acc.runs += r.runs
        acc.by_status[r.status] = acc.by_status.get(r.status, 0) + r.runs
        # Latency counts only for runs that ended; a running run's finished_at is NULL anyway.
        acc.latency_sum += float(r.latency_sum or 0)
        acc.latency_n += int(r.latency_n)
        acc.wait_sum += float(r.wait_sum or 0)
        acc.wait_n += int(r.wait_n)
    for r in usage:
        acc = versions.setdefault((r.agent_id, r.agent_version), _Acc())
        acc.input_tokens += int(r.input_tokens or 0)
        acc.output_tokens += int(r.output_tokens or 0)
        acc.cost_usd += float(r.cost_usd or 0)

    agents: dict[str, _Acc] = {}
    for (agent, _version), acc in versions.items():
        total = agents.setdefault(agent, _Acc())
        total.runs += acc.runs
        for status, n in acc.by_status.items():
            total.by_status[status] = total.by_status.get(status, 0) + n
        total.latency_sum += acc.latency_sum
        total.latency_n += acc.latency_n
        total.wait_sum += acc.wait_sum
        total.wait_n += acc.wait_n
        total.input_tokens += acc.input_tokens
        total.output_tokens += acc.output_tokens
        total.cost_usd += acc.cost_usd

    # 3. Percentiles, per version and per agent.
    base = select(AgentRun).where(*where)
    ran = base.where(ended, AgentRun.started_at.is_not(None))
    started = base.where(AgentRun.started_at.is_not(None))
    by_version = (AgentRun.agent_id, AgentRun.agent_version)
    by_agent = (AgentRun.agent_id,)
    lat_v, t1 = _dialect.percentiles(session, ran, latency, by_version)
    lat_a, t2 = _dialect.percentiles(session, ran, latency, by_agent)
    wait_v, t3 = _dialect.percentiles(session, started, wait, by_version, (0.5, 0.95))
    wait_a, t4 = _dialect.percentiles(session, started, wait, by_agent, (0.5, 0.95))

    names = _names(session, {a for a, _ in versions})

    def outcome(agent: str, version: int | None, acc: _Acc, lat, waits) -> Outcome:
        lat = lat or [None, None, None]
        waits = waits or [None, None]
        return Outcome(
            agent_id=agent,
            version=version,
            name=names.get((agent, version)),
            runs=acc.runs,
            by_status={s: acc.by_status.get(s, 0) for s in (*TERMINAL, *NON_TERMINAL)},
            latency_p50=_round(lat[0]), latency_p95=_round(lat[1]), latency_p99=_round(lat[2]),
            latency_mean=_round(acc.latency_sum / acc.latency_n) if acc.latency_n else None,
            queue_wait_p50=_round(waits[0]), queue_wait_p95=_round(waits[1]),
            queue_wait_mean=_round(acc.wait_sum / acc.wait_n) if acc.wait_n else None,
            input_tokens=acc.input_tokens,
            output_tokens=acc.output_tokens,
            cost_usd=round(acc.cost_usd, 6),
        )

    return AgentOutcomes(
        agents=[outcome(a, None, acc, lat_a.get((a,)), wait_a.get((a,)))
                for a, acc in sorted(agents.items())],
        versions=[outcome(a, v, acc, lat_v.get((a, v)), wait_v.get((a, v)))
                  for (a, v), acc in sorted(versions.items())],
        percentiles_truncated=t1 or t2 or t3 or t4,
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _names(session: Session, agent_ids: set[str]) -> dict[tuple[str, int | None], str]:
    """Each version's name, and under (agent, None) the agent's current name."""
    if not agent_ids:
        return {}
    found: dict[tuple[str, int | None], str] = {}
    rows = session.execute(
        select(AgentVersion.agent_id, AgentVersion.version, AgentVersion.name, Agent.latest_version)
        .join(Agent, Agent.id == AgentVersion.agent_id)
        .where(AgentVersion.agent_id.in_(sorted(agent_ids)))
    ).all()
    for r in rows:
        found[(r.agent_id, r.version)] = r.name
        if r.version == r.latest_version:
            found[(r.agent_id, None)] = r.name
    return found


@dataclass(frozen=True)
class OutcomeTrend:
    bucket_seconds: int
    rows: list[dict[str, Any]]
    truncated: bool


def outcome_trend(
    session: Session, window: TimeWindow, *, agent_id: str | None = None,
    version: int | None = None, bucket_seconds: int = DAY,
) -> OutcomeTrend:
    """Runs created per bucket (a day by default) and status, oldest first."""
    where = _conditions(window, agent_id)
    if version is not None:
        where.append(AgentRun.agent_version == version)
    bucket = _dialect.time_bucket(session, AgentRun.created_at, bucket_seconds).label("bucket")
    found = session.execute(
        select(bucket, AgentRun.status, func.count().label("runs"))
        .where(*where)
        .group_by(bucket, AgentRun.status)
        .order_by(bucket.desc(), AgentRun.status.desc())  # reversed below
        .limit(MAX_TREND_ROWS + 1)
    ).all()
    rows = [
        {"bucket": iso(datetime.fromtimestamp(int(r.bucket), UTC)), "status": r.status,
         "count": int(r.runs)}
        for r in reversed(found[:MAX_TREND_ROWS])
    ]
    return OutcomeTrend(bucket_seconds, rows, len(found) > MAX_TREND_ROWS)
