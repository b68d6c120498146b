"""Are the executors alive? Which runs does each hold, when did it last heartbeat, how long does
each live lease have left, which runs are at risk (lease ending within N seconds), and how far
behind is the reconciler (now − the oldest lease that expired but whose run is still active)?

Every comparison uses the database clock (``agentledger.core.dialect.now``), the same clock the
writers stamp leases with, never this process's. Active runs are read through the partial
index on live leases; executors seen lately also through the runs that ended lately. The
services whose runs were recorded from their traces (``otlp:<service.name>``) are not executors:
they held no lease and send no heartbeat, so a recorded trace never makes an executor look alive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select, union_all
from sqlalchemy.orm import Session

from agentledger.core import read_sql as _dialect
from agentledger.core.schema import AgentRun
from agentledger.core.vocabulary import ACTIVE, RECORDED_EXECUTOR_PREFIX, TERMINAL
from queries.common import (
    after_cursor,
    clamp_limit,
    decode_cursor,
    encode_cursor,
    iso,
    parse_time,
)

DEFAULT_SEEN_MINUTES = 15
DEFAULT_AT_RISK_SECONDS = 10
DEFAULT_LEASE_LIMIT = 200
MAX_LEASE_LIMIT = 1000
MAX_EXECUTORS = 500
# Statuses an executor itself writes: a run that ended so was last seen by its executor then.
_ENDED_BY_EXECUTOR = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class LeaseHealth:
    now: datetime
    seen_within_minutes: int
    at_risk_seconds: int
    executors: list[dict[str, Any]]
    leases: list[dict[str, Any]]
    leases_truncated: bool
    queued: int
    live_leases: int
    at_risk: int
    expired_unreconciled: int
    oldest_expired_lease_at: datetime | None
    next_cursor: str | None = None  # the leases after this page, soonest to expire first

    @property
    def reconcile_lag_seconds(self) -> float:
        """0 when the reconciler has nothing left to do."""
        if self.oldest_expired_lease_at is None:
            return 0.0
        return round((self.now - self.oldest_expired_lease_at).total_seconds(), 3)

    def summary(self) -> dict[str, Any]:
        return {
            "now": iso(self.now),
            "executors": len(self.executors),
            "queued": self.queued,
            "live_leases": self.live_leases,
            "at_risk": self.at_risk,
            "expired_unreconciled": self.expired_unreconciled,
            "reconcile_lag_seconds": self.reconcile_lag_seconds,
        }


def _count_when(condition):
    return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)


def _summary(session: Session, now: datetime, risk_until: datetime):
    lease = AgentRun.lease_expires_at
    active = AgentRun.status.in_(ACTIVE)
    return session.execute(
        select(
            _count_when(AgentRun.status == "queued").label("queued"),
            _count_when(active & (lease >= now)).label("live"),
            _count_when(active & (lease >= now) & (lease <= risk_until)).label("at_risk"),
            _count_when(active & (lease < now)).label("expired"),
            func.min(case((active & (lease < now), lease))).label("oldest_expired"),
        ).where(AgentRun.status.in_(("queued", *ACTIVE)))
    ).one()


def _leases(session: Session, now: datetime, risk_until: datetime, limit: int,
            cursor: str | None = None):
    stmt = select(
            AgentRun.id, AgentRun.root_run_id, AgentRun.agent_id, AgentRun.agent_version,
            AgentRun.status, AgentRun.executor_instance_id, AgentRun.lease_expires_at,
            AgentRun.last_heartbeat_at, AgentRun.started_at,
            AgentRun.agent_execution_snapshot["name"].as_string().label("agent_name"),
    ).where(AgentRun.status.in_(ACTIVE))
    if cursor:
        moment, last_id = decode_cursor(cursor, 2)
        stmt = stmt.where(after_cursor(AgentRun.lease_expires_at, AgentRun.id, parse_time(moment),
                                       last_id, descending=False))
    rows = session.execute(
        stmt.order_by(AgentRun.lease_expires_at, AgentRun.id).limit(limit + 1)
    ).all()
    leases = []
    for r in rows[:limit]:
        left = (r.lease_expires_at - now).total_seconds() if r.lease_expires_at else None
        leases.append({
            "run_id": r.id,
            "root_run_id": r.root_run_id,
            "agent_id": r.agent_id,
            "agent_name": r.agent_name,
            "agent_version": r.agent_version,
            "status": r.status,
            "executor_instance_id": r.executor_instance_id,
            "lease_expires_at": iso(r.lease_expires_at),
            "last_heartbeat_at": iso(r.last_heartbeat_at),
            "started_at": iso(r.started_at),
            "seconds_left": None if left is None else round(left, 3),
            "expired": left is not None and r.lease_expires_at < now,
            "at_risk": left is not None and now <= r.lease_expires_at <= risk_until,
        })
    more = len(rows) > limit
    last = rows[limit - 1] if more else None
    # An active run always holds a lease; a missing one would end the paging, never repeat it.
    next_cursor = (encode_cursor(last.lease_expires_at, last.id)
                   if last is not None and last.lease_expires_at is not None else None)
    return leases, more, next_cursor


def _executors(session: Session, now: datetime, since: datetime) -> list[dict[str, Any]]:
    columns = (AgentRun.executor_instance_id, AgentRun.status, AgentRun.last_heartbeat_at,
               AgentRun.finished_at)
    candidates = union_all(
        select(*columns).where(AgentRun.status.in_(ACTIVE)),
        select(*columns).where(
            AgentRun.status.in_(TERMINAL), AgentRun.finished_at >= since,
            AgentRun.executor_instance_id.is_not(None),
            # Runs recorded from traces: their service held no lease and never heartbeats.
            ~AgentRun.executor_instance_id.startswith(RECORDED_EXECUTOR_PREFIX, autoescape=True),
        ),
    ).subquery()
    held = candidates.c.status.in_(ACTIVE)
    rows = session.execute(
        select(
            candidates.c.executor_instance_id,
            _count_when(held).label("runs_held"),
            _count_when(~held).label("runs_ended_recently"),
            func.max(candidates.c.last_heartbeat_at).label("last_heartbeat_at"),
            func.max(
                case((candidates.c.status.in_(_ENDED_BY_EXECUTOR), candidates.c.finished_at))
            ).label("last_finished_at"),
        )
        .group_by(candidates.c.executor_instance_id)
        .order_by(candidates.c.executor_instance_id)
        .limit(MAX_EXECUTORS)
    ).all()
    found = []
    for r in rows:
        seen = max((t for t in (r.last_heartbeat_at, r.last_finished_at) if t is not None),
                   default=None)
        if not r.runs_held and (seen is None or seen < since):
            continue
        found.append({
            "executor_instance_id": r.executor_instance_id,
            "runs_held": int(r.runs_held),
            "runs_ended_recently": int(r.runs_ended_recently),
            "last_heartbeat_at": iso(r.last_heartbeat_at),
            "seconds_since_heartbeat": None if r.last_heartbeat_at is None
            else round((now - r.last_heartbeat_at).total_seconds(), 3),
            "last_seen_at": iso(seen),
        })
    return found


def lease_health(
    session: Session,
    *,
    seen_within_minutes: int = DEFAULT_SEEN_MINUTES,
    at_risk_seconds: int = DEFAULT_AT_RISK_SECONDS,
    limit: int = DEFAULT_LEASE_LIMIT,
    cursor: str | None = None,
) -> LeaseHealth:
    """The whole picture in one read transaction (one consistent instant on PostgreSQL)."""
    limit = clamp_limit(limit, MAX_LEASE_LIMIT)
    now = _dialect.database_now(session)
    risk_until = now + timedelta(seconds=at_risk_seconds)
    since = now - timedelta(minutes=seen_within_minutes)
    summary = _summary(session, now, risk_until)
    leases, truncated, next_cursor = _leases(session, now, risk_until, limit, cursor)
    return LeaseHealth(
        now=now,
        seen_within_minutes=seen_within_minutes,
        at_risk_seconds=at_risk_seconds,
        executors=_executors(session, now, since),
        leases=leases,
        leases_truncated=truncated,
        queued=int(summary.queued),
        live_leases=int(summary.live),
        at_risk=int(summary.at_risk),
        expired_unreconciled=int(summary.expired),
        oldest_expired_lease_at=summary.oldest_expired,
        next_cursor=next_cursor,
    )


@dataclass(frozen=True)
class LeaseCounts:
    """The lease figures alone (what ``/metrics`` exports), from the same summary read."""

    now: datetime
    queued: int
    live_leases: int
    at_risk: int
    expired_unreconciled: int
    oldest_expired_lease_at: datetime | None


def lease_counts(session: Session, *, at_risk_seconds: int = DEFAULT_AT_RISK_SECONDS) -> LeaseCounts:
    now = _dialect.database_now(session)
    summary = _summary(session, now, now + timedelta(seconds=at_risk_seconds))
    return LeaseCounts(now, int(summary.queued), int(summary.live), int(summary.at_risk),
                       int(summary.expired), summary.oldest_expired)
