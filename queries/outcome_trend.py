"""How many runs did each agent (or agent version) start per day, or per bucket, by status?

Day buckets and buckets a whole number of hours wide are read from the outcome rollups (plus
the scanned edges and live runs, as planned by ``queries.outcome_windows``); narrower buckets
count ``agent_run`` rows. At most ``MAX_TREND_ROWS`` (bucket, status) rows, the newest, with
``truncated`` saying when older ones were left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agentledger.core import read_sql as _dialect
from agentledger.core.schema import AgentRun
from agentledger.core.vocabulary import NON_TERMINAL, TERMINAL
from queries.common import TimeWindow, iso
from queries.outcome_windows import (
    DAY,
    H,
    R,
    ceil_hour,
    floor_hour,
    midnight,
    range_where,
    rollup_where,
    run_conditions,
    split_window,
)

MAX_TREND_ROWS = 5000


@dataclass(frozen=True)
class OutcomeTrend:
    bucket_seconds: int
    rows: list[dict[str, Any]]
    truncated: bool


def outcome_trend(
    session: Session, window: TimeWindow, *, agent_id: str | None = None,
    version: int | None = None, bucket_seconds: int = DAY,
) -> OutcomeTrend:
    """Runs created per bucket (a day by default) and status, oldest first.

    Day buckets come from the rollups for whole days and hours (plus the partial-hour edges
    and live runs, as in ``agent_outcomes``); buckets a whole number of hours wide from the hour
    rollup the same way; narrower buckets count ``agent_run`` rows.
    """
    if bucket_seconds != DAY:
        if bucket_seconds % 3600 == 0:
            return _trend_from_hours(session, window, agent_id, version, bucket_seconds)
        return _trend_by_scan(session, window, agent_id, version, bucket_seconds)
    split = split_window(window)
    counts: dict[tuple[int, str], int] = {}
    if split.has_days:
        for day, status, runs in session.execute(
            select(R.day, R.status, func.sum(R.runs))
            .where(*rollup_where(split, agent_id, version))
            .group_by(R.day, R.status)
        ):
            if isinstance(day, str):  # pragma: no cover - SQLite without type processing
                day = date.fromisoformat(day)
            key = (int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()), status)
            counts[key] = counts.get(key, 0) + int(runs)
    if split.hours:
        for hour, status, runs in session.execute(
            select(H.hour, H.status, func.sum(H.runs))
            .where(*range_where(split, "hour", agent_id, version))
            .group_by(H.hour, H.status)
        ):
            key = (int(midnight(hour).timestamp()), status)
            counts[key] = counts.get(key, 0) + int(runs)
    scans = [(edge, AgentRun.status.in_(TERMINAL)) for edge in split.edges]
    scans.append((window, AgentRun.status.in_(NON_TERMINAL)))
    _count_scanned(session, scans, agent_id, version, DAY, counts)
    return _trend(counts, DAY)


def _count_scanned(session: Session, scans: list[tuple[TimeWindow, Any]], agent_id: str | None,
                   version: int | None, bucket_seconds: int,
                   counts: dict[tuple[int, str], int]) -> None:
    """Add the runs of each (window part, status filter) to ``counts`` per (bucket, status)."""
    for part, status_filter in scans:
        where = [*run_conditions(part, agent_id), status_filter]
        if version is not None:
            where.append(AgentRun.agent_version == version)
        bucket = _dialect.time_bucket(session, AgentRun.created_at, bucket_seconds).label("bucket")
        for b, status, runs in session.execute(
            select(bucket, AgentRun.status, func.count()).where(*where)
            .group_by(bucket, AgentRun.status)
        ):
            counts[(int(b), status)] = counts.get((int(b), status), 0) + int(runs)


def _trend(counts: dict[tuple[int, str], int], bucket_seconds: int) -> OutcomeTrend:
    """The newest ``MAX_TREND_ROWS`` (bucket, status) counts, oldest first."""
    ordered = sorted(counts.items())
    rows = [
        {"bucket": iso(datetime.fromtimestamp(b, UTC)), "status": status, "count": n}
        for (b, status), n in ordered[-MAX_TREND_ROWS:]
    ]
    return OutcomeTrend(bucket_seconds, rows, len(ordered) > MAX_TREND_ROWS)


def _trend_from_hours(session: Session, window: TimeWindow, agent_id: str | None,
                      version: int | None, bucket_seconds: int) -> OutcomeTrend:
    """Buckets whole hours wide: ended runs of whole hours from the hour rollup (an hour lies in
    exactly one bucket, as bucket edges are multiples of an hour since the epoch), the partial
    hours at the window's edges and the runs that have not ended from ``agent_run``."""
    first = None if window.start is None else ceil_hour(window.start)
    last = None if window.end is None else floor_hour(window.end)
    counts: dict[tuple[int, str], int] = {}

    def add(bucket: int, status: str, runs: int) -> None:
        counts[(bucket, status)] = counts.get((bucket, status), 0) + runs

    scans: list[tuple[TimeWindow, Any]] = [(window, AgentRun.status.in_(NON_TERMINAL))]
    if first is not None and last is not None and first >= last:
        scans.append((window, AgentRun.status.in_(TERMINAL)))
    else:
        where = []
        if first is not None:
            where.append(H.hour >= first)
            if window.start is not None and window.start.astimezone(UTC) < first:
                scans.append((TimeWindow(window.start, first), AgentRun.status.in_(TERMINAL)))
        if last is not None:
            where.append(H.hour < last)
            if window.end is not None and last < window.end.astimezone(UTC):
                scans.append((TimeWindow(last, window.end), AgentRun.status.in_(TERMINAL)))
        if agent_id is not None:
            where.append(H.agent_id == agent_id)
        if version is not None:
            where.append(H.agent_version == version)
        for hour, status, runs in session.execute(
            select(H.hour, H.status, func.sum(H.runs)).where(*where)
            .group_by(H.hour, H.status)
        ):
            epoch = int(hour.timestamp())
            add(epoch - epoch % bucket_seconds, status, int(runs))
    _count_scanned(session, scans, agent_id, version, bucket_seconds, counts)
    return _trend(counts, bucket_seconds)


def _trend_by_scan(session: Session, window: TimeWindow, agent_id: str | None,
                   version: int | None, bucket_seconds: int) -> OutcomeTrend:
    where = run_conditions(window, agent_id)
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
