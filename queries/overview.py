"""How is the ledger doing? Runs by status over time, what is queued or running now, which runs
were interrupted lately, and are the leases healthy?

Composed from the questions that have their own module (``agent_outcomes.outcome_trend``,
``interrupted_runs``, ``lease_health``) plus one read of the unfinished runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core import read_sql as _dialect
from agentledger.core.schema import AgentRun
from agentledger.core.vocabulary import NON_TERMINAL
from queries.common import TimeWindow, clamp_limit, iso
from queries.interrupted_runs import InterruptedFilters, interrupted_runs
from queries.lease_health import lease_health
from queries.outcome_trend import outcome_trend


@dataclass(frozen=True)
class Overview:
    now: datetime
    bucket_seconds: int
    status_buckets: list[dict[str, Any]]
    buckets_truncated: bool
    totals: dict[str, int]
    unfinished_runs: list[dict[str, Any]]
    unfinished_truncated: bool
    recent_interruptions: list[dict[str, Any]]
    leases: dict[str, Any]


def bucket_seconds_for(window: TimeWindow, now: datetime) -> int:
    """A bucket width that gives a readable number of bars (about 24 to 170) for the span."""
    start = window.start or now - timedelta(days=30)
    span = ((window.end or now) - start).total_seconds()
    for width in (300, 900, 3600, 6 * 3600, 86400):
        if span / width <= 170:
            return width
    return 7 * 86400


def overview(
    session: Session, window: TimeWindow, *, unfinished_limit: int = 20,
    interruptions_limit: int = 10,
) -> Overview:
    now = _dialect.database_now(session)
    width = bucket_seconds_for(window, now)
    trend = outcome_trend(session, window, bucket_seconds=width)
    totals: dict[str, int] = {}
    for row in trend.rows:
        totals[row["status"]] = totals.get(row["status"], 0) + row["count"]

    limit = clamp_limit(unfinished_limit)
    rows = session.execute(
        select(
            AgentRun.id, AgentRun.root_run_id, AgentRun.agent_id, AgentRun.agent_version,
            AgentRun.status, AgentRun.owner_id, AgentRun.executor_instance_id,
            AgentRun.created_at, AgentRun.started_at, AgentRun.lease_expires_at,
            AgentRun.agent_execution_snapshot["name"].as_string().label("agent_name"),
        )
        .where(AgentRun.status.in_(NON_TERMINAL))
        .order_by(AgentRun.created_at.desc(), AgentRun.id.desc())
        .limit(limit + 1)
    ).all()
    unfinished = [
        {
            "run_id": r.id, "root_run_id": r.root_run_id, "agent_id": r.agent_id,
            "agent_name": r.agent_name, "agent_version": r.agent_version, "status": r.status,
            "owner_id": r.owner_id, "executor_instance_id": r.executor_instance_id,
            "created_at": iso(r.created_at), "started_at": iso(r.started_at),
            "lease_expires_at": iso(r.lease_expires_at),
        }
        for r in rows[:limit]
    ]
    recent = interrupted_runs(session, InterruptedFilters(window=window), limit=interruptions_limit)
    return Overview(
        now=now,
        bucket_seconds=width,
        status_buckets=trend.rows,
        buckets_truncated=trend.truncated,
        totals=totals,
        unfinished_runs=unfinished,
        unfinished_truncated=len(rows) > limit,
        recent_interruptions=recent.items,
        leases=lease_health(session, limit=1).summary(),
    )
