"""Where the read side's SQL differs between SQLite and PostgreSQL, in one place.

Time arithmetic (seconds since the epoch, time buckets), percentiles, and "does this context
pack contain item X". The write side's differences (upserts, row locks, the database clock)
live in ``agentledger.core.dialect``; ``now`` is re-exported from there so every lease comparison on
the read side uses the same clock as the writers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    Select,
    cast,
    exists,
    func,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from agentledger.core.dialect import name
from agentledger.core.dialect import now as database_now
from agentledger.core.schema import AgentRun

__all__ = [
    "database_now", "epoch_seconds", "seconds_between", "time_bucket", "percentiles",
    "context_pack_has_item", "PERCENTILE_SAMPLE_CAP",
]

# SQLite has no percentile aggregate: at most this many values per query are read into Python.
PERCENTILE_SAMPLE_CAP = 50_000


def _is_pg(session: Session) -> bool:
    return name(session) == "postgresql"


def epoch_seconds(session: Session, column) -> ColumnElement[float]:
    """Seconds since 1970-01-01 UTC of a time column, as a float."""
    if _is_pg(session):
        return cast(func.extract("epoch", column), Float)
    # SQLite stores UTC times as ISO text; julianday() reads it with its fractional seconds.
    return (func.julianday(column) - 2440587.5) * 86400.0


def seconds_between(session: Session, start, end) -> ColumnElement[float]:
    """``end - start`` in seconds (NULL when either is NULL)."""
    return epoch_seconds(session, end) - epoch_seconds(session, start)


def time_bucket(session: Session, column, seconds: int) -> ColumnElement[int]:
    """The start of the ``seconds``-wide bucket that holds ``column``, as epoch seconds."""
    if _is_pg(session):
        return cast(func.floor(func.extract("epoch", column) / seconds) * seconds, Integer)
    # Integer division truncates, which is floor for the positive epochs we store.
    return (cast(func.strftime("%s", column), Integer) // seconds) * seconds


def _interpolated(values: Sequence[float], fraction: float) -> float:
    """``percentile_cont``: linear interpolation between the closest ranks."""
    position = (len(values) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    if low == high:
        return float(values[low])
    return float(values[low] + (values[high] - values[low]) * (position - low))


def percentiles(
    session: Session,
    base: Select,
    value: ColumnElement,
    group_by: Sequence[ColumnElement],
    fractions: Sequence[float] = (0.5, 0.95, 0.99),
) -> tuple[dict[tuple, list[float | None]], bool]:
    """Continuous percentiles of ``value`` per group, over the rows ``base`` selects.

    ``base`` is a select whose FROM and WHERE define the rows (its columns are ignored).
    Returns ``({group key: [p per fraction]}, truncated)``. PostgreSQL computes them in SQL
    (``percentile_cont``); on SQLite the values are read, ordered, in one bounded query and
    interpolated the same way. ``truncated`` is True when that bound was hit, so the SQLite
    numbers cover only the first ``PERCENTILE_SAMPLE_CAP`` values of the ordered groups.
    """
    rows_filter = value.is_not(None)
    if _is_pg(session):
        stmt = base.with_only_columns(
            *group_by,
            *[func.percentile_cont(f).within_group(value.asc()) for f in fractions],
        ).where(rows_filter).group_by(*group_by)
        result = {
            tuple(row[: len(group_by)]): [None if v is None else float(v) for v in row[len(group_by):]]
            for row in session.execute(stmt)
        }
        return result, False
    stmt = (
        base.with_only_columns(*group_by, value)
        .where(rows_filter)
        .order_by(*group_by, value)
        .limit(PERCENTILE_SAMPLE_CAP + 1)
    )
    rows = session.execute(stmt).all()
    truncated = len(rows) > PERCENTILE_SAMPLE_CAP
    grouped: dict[tuple, list[float]] = {}
    for row in rows[:PERCENTILE_SAMPLE_CAP]:
        grouped.setdefault(tuple(row[: len(group_by)]), []).append(float(row[-1]))
    interpolated: dict[tuple, list[float | None]] = {
        key: [_interpolated(vals, f) for f in fractions] for key, vals in grouped.items()}
    return interpolated, truncated


def context_pack_has_item(
    session: Session, item_id: str, sha256: str | None = None
) -> ColumnElement[bool]:
    """SQL condition: the run's context pack lists the item (and that exact content, if given)."""
    wanted: dict[str, Any] = {"id": item_id}
    if sha256 is not None:
        wanted["sha256"] = sha256
    if _is_pg(session):
        return AgentRun.context_pack_snapshot.op("@>")(
            type_coerce({"items": [wanted]}, JSONB)
        )
    items = func.json_each(AgentRun.context_pack_snapshot, "$.items").table_valued("value")
    conditions = [func.json_extract(items.c.value, "$.id") == item_id]
    if sha256 is not None:
        conditions.append(func.json_extract(items.c.value, "$.sha256") == sha256)
    return exists(select(literal_column("1")).select_from(items).where(*conditions))
