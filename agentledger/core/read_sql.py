"""Where the read side's SQL differs between SQLite and PostgreSQL, in one place.

Time arithmetic (seconds since the epoch, time buckets) and "does this context
pack contain item X". The write side's differences (upserts, row locks, the database clock)
live in ``agentledger.core.dialect``; ``now`` is re-exported from there so every lease comparison on
the read side uses the same clock as the writers.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    and_,
    case,
    cast,
    exists,
    func,
    literal,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import ARRAY, INTERVAL, JSONB
from sqlalchemy.dialects.postgresql import FLOAT as PG_FLOAT
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from agentledger.core.dialect import name
from agentledger.core.dialect import now as database_now
from agentledger.core.outcome_histogram import EDGES
from agentledger.core.schema import AgentRun

__all__ = [
    "database_now", "epoch_seconds", "seconds_between", "time_bucket",
    "context_pack_has_item", "is_postgres", "exact_seconds_pg", "histogram_bucket_pg",
    "json_number_pg",
]

def _is_pg(session: Session) -> bool:
    return name(session) == "postgresql"


def is_postgres(session: Session) -> bool:
    """For reads that PostgreSQL answers in SQL and SQLite in Python."""
    return _is_pg(session)


# ---- PostgreSQL only: sums the database does where SQLite's are done in Python ------------

_FLOAT8 = PG_FLOAT(precision=53)
_EDGES = literal(list(EDGES), ARRAY(_FLOAT8))


_DAY = literal(timedelta(days=1), INTERVAL())
_MINUS_DAY = literal(timedelta(days=-1), INTERVAL())


def exact_seconds_pg(later, earlier) -> ColumnElement[float]:
    """``later - earlier`` in seconds as the double Python's ``timedelta.total_seconds()``
    gives for the same two times (the correctly rounded microseconds / 10⁶).

    Under a day the interval is microseconds only, and ``date_part`` divides them in float8:
    one correctly rounded division, the same double. From a day up the interval has a day part,
    which ``date_part`` adds in a second rounding step, so there ``extract`` computes the exact
    numeric and casts it; that is exact too, but ~3 µs a value (a scan of thousands of runs
    spent most of its time there), so it is kept for the rare long durations."""
    span = later - earlier
    return case((and_(span < _DAY, span > _MINUS_DAY), type_coerce(func.date_part("epoch", span), _FLOAT8)),
                else_=cast(func.extract("epoch", span), _FLOAT8))


def histogram_bucket_pg(seconds) -> ColumnElement[int]:
    """``outcome_histogram.bucket_of`` in SQL: the number of edges at or below the value (0
    below the first), by width_bucket over the same edges."""
    return func.width_bucket(seconds, _EDGES)


def json_number_pg(column, key: str, kind) -> ColumnElement:
    """A number of a JSONB document, as ``kind`` (NULL when absent or JSON null)."""
    return cast(func.jsonb_extract_path_text(column, key), kind)


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
        # date_bin is exact timestamp arithmetic (microseconds), and the bucket start it gives
        # is whole seconds, which date_part's float8 holds exactly: the same buckets as
        # ``floor(extract(epoch ...) / n)``, without a numeric division per row.
        stride = literal_column(f"interval '{int(seconds)} seconds'")
        start = func.date_bin(stride, column, literal_column("timestamptz 'epoch'"))
        return cast(func.date_part("epoch", start), BigInteger)
    # SQLite keeps times to the millisecond, so strftime rounds 23:59:59.9995 up into the
    # next second (and bucket): it is given the stored text's whole seconds only. Integer
    # division truncates, which is floor for the positive epochs we store.
    whole_seconds = func.substr(column, 1, 19)  # 'YYYY-MM-DD HH:MM:SS' of the ISO text
    return (cast(func.strftime("%s", whole_seconds), Integer) // seconds) * seconds


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
