"""Window planning for per-agent outcomes: which whole UTC days come from the day rollup, which
whole hours of the partial days from the hour rollup, which whole minutes of the partial hours
from the minute rollup (for the recent past it keeps, ``agentledger.core.rollup_periods``), and
which partial minutes (or, before that, partial hours) at the edges are scanned run by run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import and_, bindparam, or_

from agentledger.core.rollup_periods import hour_of, minute_of
from agentledger.core.schema import (
    AgentOutcomeRollup,
    AgentOutcomeRollupHour,
    AgentOutcomeRollupMinute,
    AgentRun,
)
from queries.common import TimeWindow

DAY = 86400
R = AgentOutcomeRollup.__table__.c
H = AgentOutcomeRollupHour.__table__.c
M = AgentOutcomeRollupMinute.__table__.c


def _run_conditions(start, end, agent) -> list:
    """Runs created in [start, end) of ``agent``; each is a value, a bind parameter or None
    (no such bound)."""
    found = []
    if start is not None:
        found.append(AgentRun.created_at >= start)
    if end is not None:
        found.append(AgentRun.created_at < end)
    if agent is not None:
        found.append(AgentRun.agent_id == agent)
    return found


def run_conditions(window: TimeWindow, agent_id: str | None) -> list:
    return _run_conditions(window.start, window.end, agent_id)


RUN_PARAMS = ("run_from", "run_to", "run_agent")


def run_params(window: TimeWindow, agent_id: str | None) -> dict:
    """The values of ``bound_run_conditions`` for a window and an agent (or all agents)."""
    values = dict(zip(RUN_PARAMS, (window.start, window.end, agent_id), strict=True))
    return {k: v for k, v in values.items() if v is not None}


def bound_run_conditions(names: tuple[str, ...]) -> list:
    """``run_conditions`` with the bounds and the agent as bound parameters named as in
    ``run_params``: one statement serves every window with the same set bounds."""
    return _run_conditions(*(bindparam(n) if n in names else None for n in RUN_PARAMS))


def midnight(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Split:
    """A window as whole UTC days (the day rollup), whole UTC hours of its partial days (the
    hour rollup), whole UTC minutes of its partial hours where the minute rollup keeps them,
    and the partial minutes or hours left at its edges (scanned: at most two)."""

    first_day: date | None  # None: from the beginning
    end_day: date | None  # exclusive; None: to the end
    hours: tuple[tuple[datetime, datetime], ...]  # [start, end) ranges of whole hours
    edges: tuple[TimeWindow, ...]
    has_days: bool
    minutes: tuple[tuple[datetime, datetime], ...] = ()  # [start, end) ranges of whole minutes


floor_hour = hour_of


def _ceil(moment: datetime, floor, step: timedelta) -> datetime:
    down = floor(moment)
    return down if down == moment.astimezone(UTC) else down + step


def ceil_hour(moment: datetime) -> datetime:
    return _ceil(moment, hour_of, timedelta(hours=1))


def ceil_minute(moment: datetime) -> datetime:
    return _ceil(moment, minute_of, timedelta(minutes=1))


def _split_by(part: TimeWindow, floor, ceil) -> tuple[list[tuple[datetime, datetime]],
                                                       list[TimeWindow]]:
    """A bounded part as whole periods (one range; ``floor``/``ceil`` round to the period)
    plus the partial periods at its edges."""
    assert part.start is not None and part.end is not None, "a bounded window"
    first, last = ceil(part.start), floor(part.end)
    if first >= last:
        return [], [part]
    edges = []
    if part.start.astimezone(UTC) < first:
        edges.append(TimeWindow(part.start, first))
    if last < part.end.astimezone(UTC):
        edges.append(TimeWindow(last, part.end))
    return [(first, last)], edges


def _split_hours(part: TimeWindow) -> tuple[list[tuple[datetime, datetime]], list[TimeWindow]]:
    """A bounded partial day as whole hours plus partial-hour edges."""
    return _split_by(part, floor_hour, ceil_hour)


def _split_minutes(edges: list[TimeWindow], minutes_from: datetime | None
                   ) -> tuple[list[tuple[datetime, datetime]], list[TimeWindow]]:
    """The partial-hour edges that start at or after ``minutes_from`` (None: none do) as whole
    minutes plus partial-minute edges; the others stay as they are."""
    minutes: list[tuple[datetime, datetime]] = []
    left: list[TimeWindow] = []
    for edge in edges:
        assert edge.start is not None
        if minutes_from is None or edge.start < minutes_from:
            left.append(edge)
            continue
        whole, partial = _split_by(edge, minute_of, ceil_minute)
        minutes += whole
        left += partial
    return minutes, left


def split_window(window: TimeWindow, *, minutes_from: datetime | None = None) -> Split:
    """``window`` planned over the rollups; ``minutes_from``: the oldest moment the minute
    rollup can be read from (``rollup_periods.minutes_readable_from``; None: not read)."""
    start, end = window.start, window.end
    first = None if start is None else midnight(start)
    if start is not None and first is not None and first != start.astimezone(UTC):
        first += timedelta(days=1)
    last = None if end is None else midnight(end)
    if first is not None and last is not None and first >= last:
        hours, edges = _split_hours(window)
        minutes, edges = _split_minutes(edges, minutes_from)
        return Split(None, None, tuple(hours), tuple(edges), False, tuple(minutes))
    partial_days = []
    if start is not None and first is not None and start.astimezone(UTC) < first:
        partial_days.append(TimeWindow(start, first))
    if end is not None and last is not None and last < end.astimezone(UTC):
        partial_days.append(TimeWindow(last, end))
    hours: list[tuple[datetime, datetime]] = []
    edges: list[TimeWindow] = []
    for part in partial_days:
        whole, partial = _split_hours(part)
        hours += whole
        edges += partial
    minutes, edges = _split_minutes(edges, minutes_from)
    return Split(first.date() if first else None, last.date() if last else None,
                  tuple(hours), tuple(edges), True, tuple(minutes))


# A rollup read binds the window's bounds as parameters named as in ``rollup_params`` /
# ``range_params``, so that one statement serves every window whose set bounds have the same
# names (``bound_rollup_where`` / ``bound_range_where``); the ``*_where`` forms inline them.

def rollup_params(split: Split, agent_id: str | None, version: int | None = None) -> dict:
    values = {"first_day": split.first_day, "end_day": split.end_day, "agent_id": agent_id,
              "agent_version": version}
    return {k: v for k, v in values.items() if v is not None}


def _day_conditions(values: dict, bound: bool) -> list:
    found = []
    for name, condition in (("first_day", AgentOutcomeRollup.day.__ge__),
                            ("end_day", AgentOutcomeRollup.day.__lt__),
                            ("agent_id", AgentOutcomeRollup.agent_id.__eq__),
                            ("agent_version", AgentOutcomeRollup.agent_version.__eq__)):
        if name in values:
            found.append(condition(bindparam(name) if bound else values[name]))
    return found


def rollup_where(split: Split, agent_id: str | None, version: int | None = None) -> list:
    """The day rollup rows of the split's whole days."""
    return _day_conditions(rollup_params(split, agent_id, version), bound=False)


def bound_rollup_where(names: tuple[str, ...]) -> list:
    return _day_conditions(dict.fromkeys(names), bound=True)


# The hour and minute rollups are read the same way: ranges of whole periods (``Split.hours``,
# ``Split.minutes``), bound as ``<period>_from_<n>`` / ``<period>_to_<n>``.
_PERIODS = {"hour": H, "minute": M}


def range_params(split: Split, period: str, agent_id: str | None,
                 version: int | None = None) -> dict:
    """The parameters of ``bound_range_where(period, …)`` for the split's whole hours or
    minutes (``period``: "hour" or "minute")."""
    values: dict = {"agent_id": agent_id, "agent_version": version}
    for n, (start, end) in enumerate(split.hours if period == "hour" else split.minutes):
        values[f"{period}_from_{n}"], values[f"{period}_to_{n}"] = start, end
    return {k: v for k, v in values.items() if v is not None}


def _range_conditions(period: str, values: dict, bound: bool) -> list:
    def value(name: str):
        return bindparam(name) if bound else values[name]

    rows = _PERIODS[period]
    column = rows[period]
    ranges = sum(1 for name in values if name.startswith(f"{period}_from_"))
    found = [or_(*(and_(column >= value(f"{period}_from_{n}"), column < value(f"{period}_to_{n}"))
                   for n in range(ranges)))]
    if "agent_id" in values:
        found.append(rows.agent_id == value("agent_id"))
    if "agent_version" in values:
        found.append(rows.agent_version == value("agent_version"))
    return found


def range_where(split: Split, period: str, agent_id: str | None,
                version: int | None = None) -> list:
    """The hour or minute rollup rows of the split's whole hours or minutes."""
    return _range_conditions(period, range_params(split, period, agent_id, version), bound=False)


def bound_range_where(period: str, names: tuple[str, ...]) -> list:
    return _range_conditions(period, dict.fromkeys(names), bound=True)
