"""When was each run queued, when did it run, and how did it end, for a time window and filters?

One row per run created in the window: its phases are *queued* (created → started, or → finished
when it never started, or → now while it waits) and *running* (started → finished, or → now while
it is active), then its terminal status. At most ``limit`` runs, the most recent ones, returned
oldest first; ``total`` says how many matched. ``cursor`` continues with the runs created
before the oldest of the previous page (``next_cursor``), so a long window can be read in pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agentledger.core import read_sql as _dialect
from agentledger.core.schema import AgentRun
from queries.common import (
    TimeWindow,
    after_cursor,
    clamp_limit,
    decode_cursor,
    encode_cursor,
    iso,
    parse_time,
)

DEFAULT_TIMELINE_LIMIT = 300
MAX_TIMELINE_LIMIT = 2000


@dataclass(frozen=True)
class TimelineFilters:
    status: str | None = None
    agent_id: str | None = None
    owner_id: str | None = None
    root_run_id: str | None = None
    roots_only: bool = False


@dataclass(frozen=True)
class Timeline:
    now: datetime
    rows: list[dict[str, Any]]
    total: int
    next_cursor: str | None = None

    @property
    def truncated(self) -> bool:
        return self.total > len(self.rows)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def _row(r, now: datetime) -> dict[str, Any]:
    queued_until = r.started_at or r.finished_at or now
    running_until = (r.finished_at or now) if r.started_at is not None else None
    return {
        "run_id": r.id,
        "root_run_id": r.root_run_id,
        "parent_run_id": r.parent_run_id,
        "agent_id": r.agent_id,
        "agent_name": r.agent_name,
        "agent_version": r.agent_version,
        "owner_id": r.owner_id,
        "status": r.status,
        "created_at": iso(r.created_at),
        "started_at": iso(r.started_at),
        "finished_at": iso(r.finished_at),
        "queued_until": iso(queued_until),
        "running_until": iso(running_until),
        "queued_seconds": _seconds(r.created_at, queued_until),
        "running_seconds": _seconds(r.started_at, running_until),
    }


def status_timeline(
    session: Session,
    window: TimeWindow,
    filters: TimelineFilters = TimelineFilters(),
    *,
    limit: int = DEFAULT_TIMELINE_LIMIT,
    cursor: str | None = None,
) -> Timeline:
    limit = clamp_limit(limit, MAX_TIMELINE_LIMIT)
    conditions = window.conditions(AgentRun.created_at)
    for column, value in (
        (AgentRun.status, filters.status),
        (AgentRun.agent_id, filters.agent_id),
        (AgentRun.owner_id, filters.owner_id),
        (AgentRun.root_run_id, filters.root_run_id),
    ):
        if value is not None:
            conditions.append(column == value)
    if filters.roots_only:
        conditions.append(AgentRun.parent_run_id.is_(None))
    now = _dialect.database_now(session)
    total = session.execute(select(func.count()).select_from(AgentRun).where(*conditions)).scalar_one()
    stmt = select(
            AgentRun.id, AgentRun.root_run_id, AgentRun.parent_run_id, AgentRun.agent_id,
            AgentRun.agent_version, AgentRun.owner_id, AgentRun.status, AgentRun.created_at,
            AgentRun.started_at, AgentRun.finished_at,
            AgentRun.agent_execution_snapshot["name"].as_string().label("agent_name"),
    ).where(*conditions)
    if cursor:
        moment, last_id = decode_cursor(cursor, 2)
        stmt = stmt.where(after_cursor(AgentRun.created_at, AgentRun.id, parse_time(moment), last_id))
    rows = session.execute(
        stmt.order_by(AgentRun.created_at.desc(), AgentRun.id.desc()).limit(limit + 1)
    ).all()
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = encode_cursor(rows[-1].created_at, rows[-1].id) if more else None
    return Timeline(now=now, rows=[_row(r, now) for r in reversed(rows)], total=total,
                    next_cursor=next_cursor)
