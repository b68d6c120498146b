"""Which runs were interrupted, why, on which executor, what happened last before it, when did
their lease end, who is their parent, and is it getting better or worse (count per day by reason)?

The reason is the run's ``end_reason`` (copied from its ``run.interrupted`` event, always its
last, when that is appended), so counting by reason reads runs only; a listed run's event before
the interruption is a primary-key look-up at seq = ``last_event_seq`` - 1, in the same statement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session, aliased

from agentledger.core import read_sql as _dialect
from agentledger.core.schema import AgentRun, RunEvent
from agentledger.core.vocabulary import INTERRUPT_REASONS
from queries.common import (
    DEFAULT_LIMIT,
    Page,
    TimeWindow,
    clamp_limit,
    iso,
    keyset_page,
)

REASONS = INTERRUPT_REASONS
DAY = 86400
MAX_TREND_ROWS = 5000


@dataclass(frozen=True)
class InterruptedFilters:
    """``window`` applies to when the run was interrupted (its ``finished_at``)."""

    window: TimeWindow = field(default_factory=TimeWindow)
    reason: str | None = None
    executor_instance_id: str | None = None
    agent_id: str | None = None


_before = aliased(RunEvent, name="event_before")
_parent = aliased(AgentRun, name="parent_run")
# The reason of the run's run.interrupted event, kept on the run when it is appended.
_REASON = AgentRun.end_reason


def _base(filters: InterruptedFilters):
    stmt = select(AgentRun).where(
        AgentRun.status == "interrupted", *filters.window.conditions(AgentRun.finished_at)
    )
    if filters.reason is not None:
        stmt = stmt.where(_REASON == filters.reason)
    if filters.executor_instance_id is not None:
        stmt = stmt.where(AgentRun.executor_instance_id == filters.executor_instance_id)
    if filters.agent_id is not None:
        stmt = stmt.where(AgentRun.agent_id == filters.agent_id)
    return stmt


def _item(r) -> dict[str, Any]:
    return {
        "run_id": r.id,
        "root_run_id": r.root_run_id,
        "parent_run_id": r.parent_run_id,
        "parent_status": r.parent_status,
        "agent_id": r.agent_id,
        "agent_name": r.agent_name,
        "agent_version": r.agent_version,
        "owner_id": r.owner_id,
        "reason": r.reason,
        "executor_instance_id": r.executor_instance_id,
        "lease_expires_at": iso(r.lease_expires_at),
        "last_heartbeat_at": iso(r.last_heartbeat_at),
        "created_at": iso(r.created_at),
        "started_at": iso(r.started_at),
        "interrupted_at": iso(r.finished_at),
        "interrupted_seq": r.last_event_seq,
        "last_event": None if r.before_seq is None else {
            "seq": r.before_seq,
            "type": r.before_type,
            "created_at": iso(r.before_created_at),
        },
    }


def interrupted_runs(
    session: Session, filters: InterruptedFilters, *, limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> Page:
    """Interrupted runs, most recently interrupted first, one keyset page at a time."""
    limit = clamp_limit(limit)
    stmt = (
        _base(filters)
        .with_only_columns(
            AgentRun.id, AgentRun.root_run_id, AgentRun.parent_run_id, AgentRun.agent_id,
            AgentRun.agent_version, AgentRun.owner_id, AgentRun.executor_instance_id,
            AgentRun.lease_expires_at, AgentRun.last_heartbeat_at, AgentRun.created_at,
            AgentRun.started_at, AgentRun.finished_at, AgentRun.last_event_seq,
            AgentRun.agent_execution_snapshot["name"].as_string().label("agent_name"),
            _REASON.label("reason"),
            _before.seq.label("before_seq"),
            _before.type.label("before_type"),
            _before.created_at.label("before_created_at"),
            _parent.status.label("parent_status"),
        )
        .outerjoin(
            _before, and_(_before.run_id == AgentRun.id, _before.seq == AgentRun.last_event_seq - 1)
        )
        .outerjoin(_parent, _parent.id == AgentRun.parent_run_id)
    )
    return keyset_page(session, stmt, AgentRun.finished_at, AgentRun.id, limit=limit,
                       cursor=cursor, to_item=_item)


@dataclass(frozen=True)
class InterruptionTrend:
    """Counts per (bucket, reason); ``by_reason`` totals them."""

    bucket_seconds: int
    rows: list[dict[str, Any]]
    by_reason: dict[str, int]
    truncated: bool


def interruption_trend(
    session: Session, filters: InterruptedFilters, *, bucket_seconds: int = DAY
) -> InterruptionTrend:
    """How many runs were interrupted per bucket (a day by default) and reason, oldest first."""
    bucket = _dialect.time_bucket(session, AgentRun.finished_at, bucket_seconds).label("bucket")
    reason = _REASON.label("reason")
    stmt = (
        _base(filters)
        .with_only_columns(bucket, reason, func.count().label("runs"))
        .group_by(bucket, reason)
        .order_by(bucket.desc(), reason.desc())  # reversed below: oldest first, by reason
        .limit(MAX_TREND_ROWS + 1)
    )
    found = session.execute(stmt).all()
    truncated = len(found) > MAX_TREND_ROWS
    rows = [
        {"bucket": iso(datetime.fromtimestamp(int(r.bucket), UTC)), "reason": r.reason,
         "count": int(r.runs)}
        for r in reversed(found[:MAX_TREND_ROWS])
    ]
    by_reason: dict[str, int] = {}
    for row in rows:
        by_reason[row["reason"]] = by_reason.get(row["reason"], 0) + row["count"]
    return InterruptionTrend(bucket_seconds, rows, by_reason, truncated)
