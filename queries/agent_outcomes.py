"""How does each agent, and each version of it, turn out?

For runs created in a window: counts and rates by terminal status, latency percentiles (p50,
p95, p99 of started → finished, for runs that ran and ended), queue wait (created → started),
tokens and cost summed from ``usage`` events (cost over the runs whose cost is known, with the
number of runs that had no price; a scanned run that ended with its totals recorded on its row,
``agent_run.usage_*``, is read from there, not from its events). Ended runs are read from the
incrementally maintained rollups
(whole UTC days, whole hours of partial days, whole minutes of partial hours in the last two
days; ``queries.outcome_windows`` plans the window), so a recent window of any length scans at
most two partial minutes of runs (one starting earlier, at most two partial hours);
percentiles are histogram estimates. A run counts under the agent version frozen in its snapshot
(``agent_run.agent_version``), so comparing versions compares what each really did. The trend
per day is ``queries.outcome_trend``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, Float, and_, bindparam, case, func, select, true, union_all
from sqlalchemy.orm import Session

from agentledger.core.database import execute
from agentledger.core.outcome_histogram import (
    BUCKETS,
    LATENCY_COLUMNS,
    WAIT_COLUMNS,
    estimate_percentiles,
)
from agentledger.core.outcome_sums import OutcomeSums, usage_totals
from agentledger.core.read_sql import (
    exact_seconds_pg,
    histogram_bucket_pg,
    is_postgres,
    json_number_pg,
)
from agentledger.core.rollup_periods import minutes_readable_from
from agentledger.core.schema import Agent, AgentRun, AgentVersion, RunEvent
from agentledger.core.vocabulary import NON_TERMINAL, TERMINAL
from queries.common import TimeWindow
from queries.outcome_windows import (
    H,
    M,
    R,
    Split,
    bound_range_where,
    bound_rollup_where,
    bound_run_conditions,
    range_params,
    rollup_params,
    run_params,
    split_window,
)

MAX_GROUPS = 2000
_STATUSES = len(TERMINAL)


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
    # Summed over the runs with a known cost; None when no run of the group had one.
    cost_usd: float | None = 0.0
    # Runs with an unpriced model call (``usage.cost_usd`` null): not counted in ``cost_usd``.
    runs_without_cost: int = 0

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
            "runs_without_cost": self.runs_without_cost,
        }


@dataclass(frozen=True)
class AgentOutcomes:
    agents: list[Outcome]
    versions: list[Outcome]
    # True when more than ``max_groups`` agents or versions had runs in the window: the busiest
    # (most runs, then agent id and version) are kept, the others left out.
    groups_truncated: bool = False

    def versions_of(self, agent_id: str) -> list[Outcome]:
        return [v for v in self.versions if v.agent_id == agent_id]

    def version(self, agent_id: str, version: int) -> Outcome | None:
        return next((v for v in self.versions if v.agent_id == agent_id and v.version == version), None)

    def as_dict(self) -> dict[str, Any]:
        """The JSON twin's body: both lists and whether groups were left out."""
        return {"agents": [a.as_dict() for a in self.agents],
                "versions": [v.as_dict() for v in self.versions],
                "groups_truncated": self.groups_truncated}


def _sums(table):
    hist = [func.sum(table[c]) for c in (*LATENCY_COLUMNS, *WAIT_COLUMNS)]
    runs = func.sum(table.runs)
    return (
        table.agent_id, table.agent_version, table.status,
        runs, func.sum(table.latency_n), func.sum(table.latency_sum),
        func.min(table.latency_min), func.max(table.latency_max),
        func.sum(table.wait_n), func.sum(table.wait_sum), func.min(table.wait_min),
        func.max(table.wait_max),
        func.sum(table.input_tokens), func.sum(table.output_tokens), func.sum(table.cost_usd),
        func.sum(table.runs_without_cost),
        *hist,
    ), runs


def _float(value) -> float | None:
    return None if value is None else float(value)


_ROLLUP_COLUMNS = ("agent_id", "agent_version", "status", "runs", "latency_n", "latency_sum",
                   "latency_min", "latency_max", "wait_n", "wait_sum", "wait_min", "wait_max",
                   "input_tokens", "output_tokens", "cost_usd", "runs_without_cost",
                   *LATENCY_COLUMNS, *WAIT_COLUMNS)


@functools.cache
def _rollup_query(day_bound: tuple[str, ...] | None, hour_bound: tuple[str, ...] | None,
                  minute_bound: tuple[str, ...] | None = None):
    """The sums of the day rollup's rows (windows whose set bounds are ``day_bound``), the
    hour rollup's (``hour_bound``) and the minute rollup's (``minute_bound``) together, in one
    statement built once: it has ~140 columns, and building it for every read cost more than
    running it; one statement rather than one per table saves round trips and results of
    ~140 columns."""
    parts = []
    if day_bound is not None:
        parts.append(select(*(R[c] for c in _ROLLUP_COLUMNS)).where(*bound_rollup_where(day_bound)))
    if hour_bound is not None:
        parts.append(select(*(H[c] for c in _ROLLUP_COLUMNS))
                     .where(*bound_range_where("hour", hour_bound)))
    if minute_bound is not None:
        parts.append(select(*(M[c] for c in _ROLLUP_COLUMNS))
                     .where(*bound_range_where("minute", minute_bound)))
    rows = (parts[0] if len(parts) == 1 else union_all(*parts)).subquery("rollup_rows").c
    columns, runs = _sums(rows)
    return (select(*columns)
            .group_by(rows.agent_id, rows.agent_version, rows.status)
            .order_by(runs.desc(), rows.agent_id, rows.agent_version, rows.status)
            .limit(bindparam("row_limit")))


def _from_rollup(session: Session, split: Split, agent_id: str | None,
                 versions: dict[tuple[str, int], OutcomeSums], row_limit: int) -> bool:
    """Whole days from the day rollup, whole hours of the partial days from the hour rollup,
    whole minutes of the partial hours from the minute rollup. Reads at most ``row_limit``
    (agent, version, status) rows, the busiest first; returns True when some were left out."""
    params: dict = {}
    day_bound = hour_bound = minute_bound = None
    if split.has_days:
        day_params = rollup_params(split, agent_id)
        day_bound = tuple(sorted(day_params))
        params.update(day_params)
    if split.hours:
        hours = range_params(split, "hour", agent_id)
        hour_bound = tuple(sorted(hours))
        params.update(hours)
    if split.minutes:
        minutes = range_params(split, "minute", agent_id)
        minute_bound = tuple(sorted(minutes))
        params.update(minutes)
    if day_bound is None and hour_bound is None and minute_bound is None:
        return False
    query = _rollup_query(day_bound, hour_bound, minute_bound)
    found = execute(session, query, {**params, "row_limit": row_limit + 1}).all()
    h = 16  # the first histogram column; the sums of integer buckets come back as ints
    for r in found[:row_limit]:
        # added into the version's sums in place: a 30-day read adds a row per agent version
        # and status, and an object and a histogram copy per row were most of its Python time
        acc = versions.get((r[0], r[1]))
        if acc is None:
            acc = versions[(r[0], r[1])] = OutcomeSums()
        runs = int(r[3])
        acc.runs += runs
        acc.by_status[r[2]] = acc.by_status.get(r[2], 0) + runs
        acc.latency.add_counted(int(r[4]), float(r[5]), _float(r[6]), _float(r[7]),
                                r[h:h + BUCKETS])
        acc.wait.add_counted(int(r[8]), float(r[9]), _float(r[10]), _float(r[11]),
                             r[h + BUCKETS:h + 2 * BUCKETS])
        acc.add_usage_sums(r[12], r[13], r[14], int(r[15]))
    return len(found) > row_limit


def usage_of_runs(where: list):
    """The usage events of the runs ``where`` selects, by run (a join PostgreSQL prunes per run
    to the partition holding it)."""
    return (
        select(AgentRun.id, AgentRun.agent_id, AgentRun.agent_version, RunEvent.data)
        .join(RunEvent, and_(RunEvent.run_id == AgentRun.id, RunEvent.type == "usage"))
        .where(*where)
        .order_by(RunEvent.run_id, RunEvent.seq)
    )


@functools.cache
def _scan_where(bound: tuple[str, ...], ended: bool) -> tuple:
    """The conditions of one scan (a partial-hour edge of ended runs, or the window's live
    runs), with the set bounds ``bound`` as parameters (``run_params``): each scan statement is
    built and cache-keyed once, not at every read."""
    return (*bound_run_conditions(bound), AgentRun.status.in_(TERMINAL if ended else NON_TERMINAL))


@functools.cache
def _summed_statements(bound: tuple[str, ...], ended: bool) -> tuple:
    where = list(_scan_where(bound, ended))
    return summed_runs(where), unrecorded_usage(where)


def _scan(session: Session, window: TimeWindow, agent_id: str | None, ended: bool,
          versions: dict[tuple[str, int], OutcomeSums]) -> None:
    """Add the runs created in ``window`` (of ``agent_id``), ended or not yet ended (the
    partial-hour edges and the live runs only)."""
    params = run_params(window, agent_id)
    bound = tuple(sorted(params))
    if is_postgres(session):
        _scan_in_database(session, _summed_statements(bound, ended), params, versions)
    else:
        _scan_run_by_run(session, list(_scan_where(bound, ended)), params, versions)


def _scan_run_by_run(session: Session, where: list, params: dict,
                     versions: dict[tuple[str, int], OutcomeSums]) -> None:
    runs = session.execute(
        select(AgentRun.id, AgentRun.agent_id, AgentRun.agent_version, AgentRun.status,
               AgentRun.created_at, AgentRun.started_at, AgentRun.finished_at,
               AgentRun.usage_input_tokens, AgentRun.usage_output_tokens,
               AgentRun.usage_cost_usd).where(*where),
        params,
    ).all()
    unrecorded = False
    for r in runs:
        latency = wait = None
        if r.started_at is not None:
            wait = (r.started_at - r.created_at).total_seconds()
            if r.status in TERMINAL and r.finished_at is not None:
                latency = (r.finished_at - r.started_at).total_seconds()
        acc = versions.setdefault((r.agent_id, r.agent_version), OutcomeSums())
        acc.add_run(r.status, latency, wait)
        if r.usage_input_tokens is None:
            unrecorded = True
        else:  # the totals recorded when it ended
            acc.add_usage(r.usage_input_tokens, r.usage_output_tokens, r.usage_cost_usd)
    if not unrecorded:
        return
    usage: dict[str, tuple[tuple[str, int], list[dict]]] = {}
    for r in session.execute(usage_of_runs([*where, AgentRun.usage_input_tokens.is_(None)]),
                             params):
        usage.setdefault(r.id, ((r.agent_id, r.agent_version), []))[1].append(r.data)
    for key, datas in usage.values():
        versions[key].add_usage(*usage_totals(datas))


def summed_runs(where: list):
    """PostgreSQL: the runs ``where`` selects, summed per agent version and status: counts,
    duration sums and extremes, each duration's histogram bucket (one array per kind, which
    ``_scan_in_database`` counts: grouping by bucket pairs made a group of almost every run),
    and the usage totals recorded on the rows. ``unrecorded`` counts the started runs without
    recorded totals (ended before the totals existed, or not ended yet), whose usage
    ``unrecorded_usage`` reads from their events."""
    latency = case((and_(AgentRun.status.in_(TERMINAL), AgentRun.finished_at.is_not(None),
                         AgentRun.started_at.is_not(None)),
                    exact_seconds_pg(AgentRun.finished_at, AgentRun.started_at)))
    wait = case((AgentRun.started_at.is_not(None),
                 exact_seconds_pg(AgentRun.started_at, AgentRun.created_at)))
    runs = (select(AgentRun.agent_id, AgentRun.agent_version, AgentRun.status,
                   AgentRun.started_at, AgentRun.usage_input_tokens,
                   AgentRun.usage_output_tokens, AgentRun.usage_cost_usd,
                   latency.label("latency"), wait.label("wait"))
            .where(*where)
            # OFFSET 0 keeps PostgreSQL from pulling the subquery up into the aggregate, which
            # then evaluated each duration expression once per aggregate naming it (five
            # times a run) instead of once: a 1,200-run edge aggregated in 0.6 ms, not 2.5
            .offset(0)
            .subquery())
    r = runs.c
    recorded = r.usage_input_tokens.is_not(None)
    return (
        select(r.agent_id, r.agent_version, r.status, func.count(),
               func.sum(r.latency), func.min(r.latency), func.max(r.latency),
               func.array_agg(histogram_bucket_pg(r.latency)).filter(r.latency.is_not(None)),
               func.sum(r.wait), func.min(r.wait), func.max(r.wait),
               func.array_agg(histogram_bucket_pg(r.wait)).filter(r.wait.is_not(None)),
               func.sum(r.usage_input_tokens), func.sum(r.usage_output_tokens),
               func.sum(r.usage_cost_usd).filter(recorded),
               func.count().filter(and_(recorded, r.usage_cost_usd.is_(None))),
               func.count().filter(and_(r.usage_input_tokens.is_(None),
                                        r.started_at.is_not(None))).label("unrecorded"))
        .group_by(r.agent_id, r.agent_version, r.status)
    )


def unrecorded_usage(where: list):
    """PostgreSQL: usage per agent version of the started runs ``where`` selects that have no
    totals recorded on their row, summed from each run's ``usage`` events (a lateral read of
    its own events, which PostgreSQL prunes per run to the partition holding it)."""
    usage = (
        select(func.sum(json_number_pg(RunEvent.data, "input_tokens", BigInteger))
               .label("tokens_in"),
               func.sum(json_number_pg(RunEvent.data, "output_tokens", BigInteger))
               .label("tokens_out"),
               func.sum(json_number_pg(RunEvent.data, "cost_usd", Float)).label("cost"),
               # a run with an unpriced call counts in runs_without_cost (usage_totals);
               # null when the run has no usage event at all
               func.bool_or(func.jsonb_extract_path_text(RunEvent.data, "cost_usd").is_(None))
               .label("unpriced"))
        .where(RunEvent.run_id == AgentRun.id, RunEvent.type == "usage")
        .lateral("usage")
    )
    u = usage.c
    return (select(AgentRun.agent_id, AgentRun.agent_version, func.sum(u.tokens_in),
                   func.sum(u.tokens_out), func.sum(u.cost).filter(u.unpriced.is_(False)),
                   func.count().filter(u.unpriced.is_(True)))
            .select_from(AgentRun).join(usage, true())
            .where(*where, AgentRun.started_at.is_not(None),
                   AgentRun.usage_input_tokens.is_(None))
            .group_by(AgentRun.agent_id, AgentRun.agent_version))


def _scan_in_database(session: Session, statements: tuple, params: dict,
                      versions: dict[tuple[str, int], OutcomeSums]) -> None:
    """The same sums as ``_scan_run_by_run``, added up by PostgreSQL (a 1-hour edge at a busy
    hour is thousands of runs: their rows never reach Python). ``statements`` are
    ``summed_runs`` and ``unrecorded_usage`` of the same conditions; the second runs only when
    the first counted runs without recorded totals."""
    summed, usage = statements
    unrecorded = 0
    for (agent, version, status, n, lat_sum, lat_min, lat_max, lat_buckets,
         wait_sum, wait_min, wait_max, wait_buckets, tokens_in, tokens_out, cost,
         unpriced, without_totals) in execute(session, summed, params):
        acc = versions.get((agent, version))
        if acc is None:
            acc = versions[(agent, version)] = OutcomeSums()
        acc.runs += n
        acc.by_status[status] = acc.by_status.get(status, 0) + n
        if lat_buckets:  # NULL when no run of the group has a latency
            acc.latency.add_summed(lat_sum, lat_min, lat_max, lat_buckets)
        if wait_buckets:
            acc.wait.add_summed(wait_sum, wait_min, wait_max, wait_buckets)
        acc.add_usage_sums(tokens_in, tokens_out, cost, unpriced)
        unrecorded += without_totals
    if not unrecorded:
        return
    for agent, version, tokens_in, tokens_out, cost, unpriced in execute(session, usage, params):
        versions[(agent, version)].add_usage_sums(tokens_in, tokens_out, cost, unpriced)


def _busiest(groups: dict, max_groups: int) -> tuple[dict, bool]:
    """The ``max_groups`` groups with the most runs (ties: by key), and whether any was cut."""
    if len(groups) <= max_groups:
        return groups, False
    kept = sorted(groups, key=lambda k: (-groups[k].runs, k))[:max_groups]
    return {k: groups[k] for k in kept}, True


def agent_outcomes(
    session: Session, window: TimeWindow, *, agent_id: str | None = None,
    max_groups: int = MAX_GROUPS, now: datetime | None = None,
) -> AgentOutcomes:
    """Outcomes of the runs created in ``window``, per agent and per version (each list sorted
    by agent id and version).

    Ended runs come from ``agent_outcome_rollup`` for the whole UTC days of the window, from
    ``agent_outcome_rollup_hour`` for the whole hours of its partial days and from
    ``agent_outcome_rollup_minute`` for the whole minutes of its partial hours (those the
    minute rollup keeps at ``now``, the last two days); runs of the partial minutes at its
    edges (or of partial hours longer ago), and runs that have not ended yet (few, on a
    partial index), are read from ``agent_run``. Counts, rates, tokens and cost are exact;
    percentiles are estimated from the rollup's log-scale histograms (within one bucket,
    ≤ 26 %), means exact. At most ``max_groups`` agents and versions are returned, the ones
    with the most runs; ``groups_truncated`` says when others were left out.
    """
    split = split_window(window, minutes_from=minutes_readable_from(now or datetime.now(UTC)))
    versions: dict[tuple[str, int], OutcomeSums] = {}
    truncated = _from_rollup(session, split, agent_id, versions, max_groups * _STATUSES)
    for edge in split.edges:
        _scan(session, edge, agent_id, True, versions)
    _scan(session, window, agent_id, False, versions)

    agents: dict[str, OutcomeSums] = {}
    for (agent, _version), acc in versions.items():
        agents.setdefault(agent, OutcomeSums()).merge(acc)
    versions, cut_versions = _busiest(versions, max_groups)
    agents, cut_agents = _busiest(agents, max_groups)

    names = _names(session, set(agents) | {a for a, _ in versions})

    def outcome(agent: str, version: int | None, acc: OutcomeSums) -> Outcome:
        lat = estimate_percentiles(acc.latency.histogram, (0.5, 0.95, 0.99), acc.latency.min,
                                   acc.latency.max)
        waits = estimate_percentiles(acc.wait.histogram, (0.5, 0.95), acc.wait.min, acc.wait.max)
        cost = acc.known_cost
        return Outcome(
            agent_id=agent,
            version=version,
            name=names.get((agent, version)),
            runs=acc.runs,
            by_status={s: acc.by_status.get(s, 0) for s in (*TERMINAL, *NON_TERMINAL)},
            latency_p50=_round(lat[0]), latency_p95=_round(lat[1]), latency_p99=_round(lat[2]),
            latency_mean=_round(acc.latency.mean),
            queue_wait_p50=_round(waits[0]), queue_wait_p95=_round(waits[1]),
            queue_wait_mean=_round(acc.wait.mean),
            input_tokens=acc.input_tokens,
            output_tokens=acc.output_tokens,
            cost_usd=None if cost is None else round(cost, 6),
            runs_without_cost=acc.runs_without_cost,
        )

    return AgentOutcomes(
        agents=[outcome(a, None, acc) for a, acc in sorted(agents.items())],
        versions=[outcome(a, v, acc) for (a, v), acc in sorted(versions.items())],
        groups_truncated=truncated or cut_versions or cut_agents,
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


_NAMES = (select(AgentVersion.agent_id, AgentVersion.version, AgentVersion.name,
                 Agent.latest_version)
          .join(Agent, Agent.id == AgentVersion.agent_id)
          .where(AgentVersion.agent_id.in_(bindparam("agent_ids", expanding=True))))


def _names(session: Session, agent_ids: set[str]) -> dict[tuple[str, int | None], str]:
    """Each version's name, and under (agent, None) the agent's current name."""
    if not agent_ids:
        return {}
    found: dict[tuple[str, int | None], str] = {}
    rows = execute(session, _NAMES, {"agent_ids": sorted(agent_ids)}).all()
    for r in rows:
        found[(r.agent_id, r.version)] = r.name
        if r.version == r.latest_version:
            found[(r.agent_id, None)] = r.name
    return found
