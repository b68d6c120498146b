"""How does each agent, and each version of it, turn out?

For runs created in a window: counts and rates by terminal status, latency percentiles (p50,
p95, p99 of started → finished, for runs that ran and ended), queue wait (created → started),
tokens and cost summed from ``usage`` events, and the trend per day. Ended runs are read from
the incrementally maintained rollups (whole UTC days, and whole hours of partial days), so a
window of any length scans at most two partial hours of runs; percentiles are histogram
estimates. A run counts under the
agent version frozen in its snapshot (``agent_run.agent_version``), so comparing versions
compares what each really did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from agentledger.core import read_sql as _dialect
from agentledger.core.outcome_histogram import (
    BUCKETS,
    LATENCY_COLUMNS,
    WAIT_COLUMNS,
    bucket_of,
    estimate_percentiles,
)
from agentledger.core.schema import (
    Agent,
    AgentOutcomeRollup,
    AgentOutcomeRollupHour,
    AgentRun,
    AgentVersion,
    RunEvent,
)
from agentledger.core.vocabulary import NON_TERMINAL, TERMINAL
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
    latency_min: float | None = None
    latency_max: float | None = None
    latency_h: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    wait_sum: float = 0.0
    wait_n: int = 0
    wait_min: float | None = None
    wait_max: float | None = None
    wait_h: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def merge(self, other: _Acc) -> None:
        self.runs += other.runs
        for status, n in other.by_status.items():
            self.by_status[status] = self.by_status.get(status, 0) + n
        self.latency_sum += other.latency_sum
        self.latency_n += other.latency_n
        self.wait_sum += other.wait_sum
        self.wait_n += other.wait_n
        self.latency_min = _lower(self.latency_min, other.latency_min)
        self.latency_max = _higher(self.latency_max, other.latency_max)
        self.wait_min = _lower(self.wait_min, other.wait_min)
        self.wait_max = _higher(self.wait_max, other.wait_max)
        self.latency_h = [a + b for a, b in zip(self.latency_h, other.latency_h, strict=True)]
        self.wait_h = [a + b for a, b in zip(self.wait_h, other.wait_h, strict=True)]
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost_usd += other.cost_usd

    def add_run(self, status: str, latency: float | None, wait: float | None) -> None:
        self.runs += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if latency is not None:
            self.latency_n += 1
            self.latency_sum += latency
            self.latency_min = _lower(self.latency_min, latency)
            self.latency_max = _higher(self.latency_max, latency)
            self.latency_h[bucket_of(latency)] += 1
        if wait is not None:
            self.wait_n += 1
            self.wait_sum += wait
            self.wait_min = _lower(self.wait_min, wait)
            self.wait_max = _higher(self.wait_max, wait)
            self.wait_h[bucket_of(wait)] += 1


def _lower(a: float | None, b: float | None) -> float | None:
    return a if b is None or (a is not None and a <= b) else b


def _higher(a: float | None, b: float | None) -> float | None:
    return a if b is None or (a is not None and a >= b) else b


def _conditions(window: TimeWindow, agent_id: str | None) -> list:
    found = window.conditions(AgentRun.created_at)
    if agent_id is not None:
        found.append(AgentRun.agent_id == agent_id)
    return found


def _midnight(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class _Split:
    """A window as whole UTC days (the day rollup), whole UTC hours of its partial days (the
    hour rollup) and partial hours at its edges (scanned: at most two hours of runs)."""

    first_day: date | None  # None: from the beginning
    end_day: date | None  # exclusive; None: to the end
    hours: tuple[tuple[datetime, datetime], ...]  # [start, end) ranges of whole hours
    edges: tuple[TimeWindow, ...]
    has_days: bool


def _floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _ceil_hour(moment: datetime) -> datetime:
    floor = _floor_hour(moment)
    return floor if floor == moment.astimezone(UTC) else floor + timedelta(hours=1)


def _split_hours(part: TimeWindow) -> tuple[list[tuple[datetime, datetime]], list[TimeWindow]]:
    """A bounded partial day as whole hours plus partial-hour edges."""
    assert part.start is not None and part.end is not None
    first, last = _ceil_hour(part.start), _floor_hour(part.end)
    if first >= last:
        return [], [part]
    edges = []
    if part.start.astimezone(UTC) < first:
        edges.append(TimeWindow(part.start, first))
    if last < part.end.astimezone(UTC):
        edges.append(TimeWindow(last, part.end))
    return [(first, last)], edges


def _split(window: TimeWindow) -> _Split:
    start, end = window.start, window.end
    first = None if start is None else _midnight(start)
    if first is not None and start is not None and first != start.astimezone(UTC):
        first += timedelta(days=1)
    last = None if end is None else _midnight(end)
    if first is not None and last is not None and first >= last:
        hours, edges = _split_hours(window)
        return _Split(None, None, tuple(hours), tuple(edges), False)
    partial_days = []
    if first is not None and start is not None and start.astimezone(UTC) < first:
        partial_days.append(TimeWindow(start, first))
    if last is not None and end is not None and last < end.astimezone(UTC):
        partial_days.append(TimeWindow(last, end))
    hours: list[tuple[datetime, datetime]] = []
    edges: list[TimeWindow] = []
    for part in partial_days:
        whole, partial = _split_hours(part)
        hours += whole
        edges += partial
    return _Split(first.date() if first else None, last.date() if last else None,
                  tuple(hours), tuple(edges), True)


def _rollup_where(split: _Split, agent_id: str | None, version: int | None = None) -> list:
    found = []
    if split.first_day is not None:
        found.append(AgentOutcomeRollup.day >= split.first_day)
    if split.end_day is not None:
        found.append(AgentOutcomeRollup.day < split.end_day)
    if agent_id is not None:
        found.append(AgentOutcomeRollup.agent_id == agent_id)
    if version is not None:
        found.append(AgentOutcomeRollup.agent_version == version)
    return found


def _hour_where(split: _Split, agent_id: str | None, version: int | None = None) -> list:
    found = [or_(*(and_(_H.hour >= a, _H.hour < b) for a, b in split.hours))]
    if agent_id is not None:
        found.append(_H.agent_id == agent_id)
    if version is not None:
        found.append(_H.agent_version == version)
    return found


_R = AgentOutcomeRollup.__table__.c
_H = AgentOutcomeRollupHour.__table__.c


def _sums(table):
    hist = [func.sum(table[c]) for c in (*LATENCY_COLUMNS, *WAIT_COLUMNS)]
    return (
        table.agent_id, table.agent_version, table.status,
        func.sum(table.runs), func.sum(table.latency_n), func.sum(table.latency_sum),
        func.min(table.latency_min), func.max(table.latency_max),
        func.sum(table.wait_n), func.sum(table.wait_sum), func.min(table.wait_min),
        func.max(table.wait_max),
        func.sum(table.input_tokens), func.sum(table.output_tokens), func.sum(table.cost_usd),
        *hist,
    )


def _from_rollup(session: Session, split: _Split, agent_id: str | None,
                 versions: dict[tuple[str, int], _Acc]) -> None:
    """Whole days from the day rollup, whole hours of the partial days from the hour rollup."""
    queries = []
    if split.has_days:
        queries.append(select(*_sums(_R)).where(*_rollup_where(split, agent_id))
                       .group_by(_R.agent_id, _R.agent_version, _R.status))
    if split.hours:
        queries.append(select(*_sums(_H)).where(*_hour_where(split, agent_id))
                       .group_by(_H.agent_id, _H.agent_version, _H.status))
    for query in queries:
        for r in session.execute(query.limit(MAX_GROUPS)).all():
            acc = _Acc(
                runs=int(r[3]), by_status={r[2]: int(r[3])},
                latency_n=int(r[4]), latency_sum=float(r[5]),
                latency_min=None if r[6] is None else float(r[6]),
                latency_max=None if r[7] is None else float(r[7]),
                wait_n=int(r[8]), wait_sum=float(r[9]),
                wait_min=None if r[10] is None else float(r[10]),
                wait_max=None if r[11] is None else float(r[11]),
                input_tokens=int(r[12]), output_tokens=int(r[13]), cost_usd=float(r[14]),
                latency_h=[int(v) for v in r[15:15 + BUCKETS]],
                wait_h=[int(v) for v in r[15 + BUCKETS:15 + 2 * BUCKETS]],
            )
            versions.setdefault((r[0], r[1]), _Acc()).merge(acc)


def _scan(session: Session, where: list, versions: dict[tuple[str, int], _Acc]) -> None:
    """Add the runs ``where`` selects, one by one (partial-day edges and live runs only)."""
    runs = session.execute(
        select(AgentRun.agent_id, AgentRun.agent_version, AgentRun.status, AgentRun.created_at,
               AgentRun.started_at, AgentRun.finished_at).where(*where)
    ).all()
    for r in runs:
        latency = wait = None
        if r.started_at is not None:
            wait = (r.started_at - r.created_at).total_seconds()
            if r.status in TERMINAL and r.finished_at is not None:
                latency = (r.finished_at - r.started_at).total_seconds()
        versions.setdefault((r.agent_id, r.agent_version), _Acc()).add_run(r.status, latency, wait)
    if not runs:
        return
    usage = session.execute(
        select(AgentRun.agent_id, AgentRun.agent_version, RunEvent.data)
        .join(RunEvent, and_(RunEvent.run_id == AgentRun.id, RunEvent.type == "usage"))
        .where(*where)
        .order_by(RunEvent.run_id, RunEvent.seq)
    ).all()
    for r in usage:
        acc = versions[(r.agent_id, r.agent_version)]
        acc.input_tokens += int(r.data.get("input_tokens") or 0)
        acc.output_tokens += int(r.data.get("output_tokens") or 0)
        acc.cost_usd += float(r.data.get("cost_usd") or 0)


def agent_outcomes(
    session: Session, window: TimeWindow, *, agent_id: str | None = None
) -> AgentOutcomes:
    """Outcomes of the runs created in ``window``.

    Ended runs come from ``agent_outcome_rollup`` for the whole UTC days of the window and from
    ``agent_outcome_rollup_hour`` for the whole hours of its partial days; runs of the partial
    hours at its edges (at most two hours), and runs that have not ended yet (few, on a
    partial index), are read from ``agent_run``. Counts, rates, tokens and cost are exact; percentiles are
    estimated from the rollup's log-scale histograms (within one bucket, ≤ 26 %), means exact.
    """
    split = _split(window)
    versions: dict[tuple[str, int], _Acc] = {}
    _from_rollup(session, split, agent_id, versions)
    for edge in split.edges:
        _scan(session, [*_conditions(edge, agent_id), AgentRun.status.in_(TERMINAL)], versions)
    _scan(session, [*_conditions(window, agent_id), AgentRun.status.in_(NON_TERMINAL)], versions)

    agents: dict[str, _Acc] = {}
    for (agent, _version), acc in versions.items():
        agents.setdefault(agent, _Acc()).merge(acc)

    names = _names(session, {a for a, _ in versions})

    def outcome(agent: str, version: int | None, acc: _Acc) -> Outcome:
        lat = estimate_percentiles(acc.latency_h, (0.5, 0.95, 0.99), acc.latency_min,
                                   acc.latency_max)
        waits = estimate_percentiles(acc.wait_h, (0.5, 0.95), acc.wait_min, acc.wait_max)
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
        agents=[outcome(a, None, acc) for a, acc in sorted(agents.items())],
        versions=[outcome(a, v, acc) for (a, v), acc in sorted(versions.items())],
        percentiles_truncated=False,
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
    """Runs created per bucket (a day by default) and status, oldest first.

    Day buckets come from the rollups for whole days and hours (plus the partial-hour edges
    and live runs, as in ``agent_outcomes``); buckets a whole number of hours wide from the hour
    rollup the same way; narrower buckets count ``agent_run`` rows.
    """
    if bucket_seconds != DAY:
        if bucket_seconds % 3600 == 0:
            return _trend_from_hours(session, window, agent_id, version, bucket_seconds)
        return _trend_by_scan(session, window, agent_id, version, bucket_seconds)
    split = _split(window)
    counts: dict[tuple[int, str], int] = {}
    if split.has_days:
        for day, status, runs in session.execute(
            select(_R.day, _R.status, func.sum(_R.runs))
            .where(*_rollup_where(split, agent_id, version))
            .group_by(_R.day, _R.status)
        ):
            if isinstance(day, str):  # pragma: no cover - SQLite without type processing
                day = date.fromisoformat(day)
            key = (int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()), status)
            counts[key] = counts.get(key, 0) + int(runs)
    if split.hours:
        for hour, status, runs in session.execute(
            select(_H.hour, _H.status, func.sum(_H.runs))
            .where(*_hour_where(split, agent_id, version))
            .group_by(_H.hour, _H.status)
        ):
            key = (int(_midnight(hour).timestamp()), status)
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
        where = [*_conditions(part, agent_id), status_filter]
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
    first = None if window.start is None else _ceil_hour(window.start)
    last = None if window.end is None else _floor_hour(window.end)
    counts: dict[tuple[int, str], int] = {}

    def add(bucket: int, status: str, runs: int) -> None:
        counts[(bucket, status)] = counts.get((bucket, status), 0) + runs

    scans: list[tuple[TimeWindow, Any]] = [(window, AgentRun.status.in_(NON_TERMINAL))]
    if first is not None and last is not None and first >= last:
        scans.append((window, AgentRun.status.in_(TERMINAL)))
    else:
        where = []
        if first is not None:
            where.append(_H.hour >= first)
            if window.start is not None and window.start.astimezone(UTC) < first:
                scans.append((TimeWindow(window.start, first), AgentRun.status.in_(TERMINAL)))
        if last is not None:
            where.append(_H.hour < last)
            if window.end is not None and last < window.end.astimezone(UTC):
                scans.append((TimeWindow(last, window.end), AgentRun.status.in_(TERMINAL)))
        if agent_id is not None:
            where.append(_H.agent_id == agent_id)
        if version is not None:
            where.append(_H.agent_version == version)
        for hour, status, runs in session.execute(
            select(_H.hour, _H.status, func.sum(_H.runs)).where(*where)
            .group_by(_H.hour, _H.status)
        ):
            epoch = int(hour.timestamp())
            add(epoch - epoch % bucket_seconds, status, int(runs))
    _count_scanned(session, scans, agent_id, version, bucket_seconds, counts)
    return _trend(counts, bucket_seconds)


def _trend_by_scan(session: Session, window: TimeWindow, agent_id: str | None,
                   version: int | None, bucket_seconds: int) -> OutcomeTrend:
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
