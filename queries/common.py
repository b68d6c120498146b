"""Shared pieces of the read side: time formatting, cursors, pages and owner visibility."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import literal, text, tuple_

from agentledger.core.database import outside_transaction
from agentledger.core.errors import InvalidRequest
from agentledger.core.hashing import is_storable_text
from agentledger.core.schema import AgentRun
from queries.visibility import run_visible_to, session_visible_to  # noqa: F401 - re-exported

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


class BadCursor(InvalidRequest):
    """A cursor that this server did not produce (400 ``invalid_request``)."""


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"items": self.items, "next_cursor": self.next_cursor}


def encode_cursor(*values: Any) -> str:
    raw = json.dumps([v.isoformat() if isinstance(v, datetime) else v for v in values])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, size: int) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()).decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadCursor("cursor is not valid") from exc
    # Every cursor this server makes is a list of strings (ids and ISO times); anything else
    # (numbers, null, nested objects) must be refused here, not reach the SQL as a parameter.
    if (not isinstance(values, list) or len(values) != size
            or not all(isinstance(v, str) for v in values)):
        raise BadCursor("cursor is not valid")
    # JSON escapes can spell what no id holds and neither database takes: NUL, lone surrogates.
    if not all(is_storable_text(v) for v in values):
        raise BadCursor("cursor is not valid")
    return values


def parse_time(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError) as exc:
        raise BadCursor("cursor is not valid") from exc
    if moment.tzinfo is None:
        raise BadCursor("cursor is not valid")
    try:
        return moment.astimezone(UTC)  # the databases compare in UTC; year 1 at +14:00 has none
    except OverflowError:
        raise BadCursor("cursor is not valid") from None


# What ``run_summary`` reads (and an admin's ``redaction_count``): the point reads of a run
# select these columns, not the mapped entity (its loading cost about three times the read).
RUN_SUMMARY_COLUMNS = (
    AgentRun.id, AgentRun.session_id, AgentRun.thread_id, AgentRun.root_run_id,
    AgentRun.parent_run_id, AgentRun.owner_id, AgentRun.agent_id, AgentRun.status,
    AgentRun.agent_execution_snapshot, AgentRun.context_pack_snapshot, AgentRun.last_event_seq,
    AgentRun.executor_instance_id, AgentRun.lease_expires_at, AgentRun.final_message_id,
    AgentRun.error, AgentRun.created_at, AgentRun.started_at, AgentRun.finished_at,
    AgentRun.redaction_count,
)


def run_summary(row) -> dict[str, Any]:
    """The contract's run object from a row with ``RUN_SUMMARY_COLUMNS`` (or an ``AgentRun``)."""
    snapshot = row.agent_execution_snapshot
    return {
        "id": row.id,
        "session_id": row.session_id,
        "thread_id": row.thread_id,
        "root_run_id": row.root_run_id,
        "parent_run_id": row.parent_run_id,
        "owner_id": row.owner_id,
        "agent_id": row.agent_id,
        "agent_name": snapshot.get("name"),
        "agent_version": snapshot.get("version"),
        "status": row.status,
        "agent_execution_snapshot": snapshot,
        "context_pack_snapshot": row.context_pack_snapshot,
        "last_event_seq": row.last_event_seq,
        "executor_instance_id": row.executor_instance_id,
        "lease_expires_at": iso(row.lease_expires_at),
        "final_message_id": row.final_message_id,
        "error": row.error,
        "created_at": iso(row.created_at),
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "events_url": f"/api/agent-runs/{row.id}/events",
    }


def after_cursor(time_column, id_column, moment: datetime, last_id: str, *, descending: bool = True):
    """Keyset condition: rows after (moment, last_id) in (time, id) order."""
    key = tuple_(time_column, id_column)
    bound = tuple_(literal(moment, type_=time_column.type), literal(last_id, type_=id_column.type))
    return key < bound if descending else key > bound


@dataclass(frozen=True)
class TimeWindow:
    """A half-open UTC interval ``[start, end)``; either side may be open (None)."""

    start: datetime | None = None
    end: datetime | None = None

    def __post_init__(self) -> None:
        for moment in (self.start, self.end):
            if moment is not None and moment.tzinfo is None:
                raise ValueError("TimeWindow needs timezone-aware datetimes")

    def conditions(self, column) -> list:
        """SQL conditions that keep ``column`` inside the window (range on its index)."""
        found = []
        if self.start is not None:
            found.append(column >= self.start)
        if self.end is not None:
            found.append(column < self.end)
        return found


# The preset windows of the dashboards and their JSON twins: a span ending now (None: all time).
WINDOW_SPANS: dict[str, timedelta | None] = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "14d": timedelta(days=14),
    "30d": timedelta(days=30),
    "90d": timedelta(days=90),
    "all": None,
}


def preset_window(key: str, now: datetime) -> TimeWindow:
    """The window a preset names, ending now."""
    span = WINDOW_SPANS[key]
    return TimeWindow(now - span, None) if span is not None else TimeWindow()


def clamp_limit(limit: int, maximum: int = MAX_LIMIT) -> int:
    """Every read is bounded: at least 1 row, at most ``maximum``."""
    return max(1, min(int(limit), maximum))


_NO_PARALLEL_WORKERS = text("SET LOCAL max_parallel_workers_per_gather = 0")
_DEFAULT_PARALLEL_WORKERS = text("SET LOCAL max_parallel_workers_per_gather TO DEFAULT")
# Outside a transaction (``Database.read`` on PostgreSQL's primary) SET LOCAL does nothing: the
# setting is the connection's until it is reset, whatever the page read does.
_NO_PARALLEL_WORKERS_HERE = text("SET max_parallel_workers_per_gather = 0")
_RESET_PARALLEL_WORKERS = text("RESET max_parallel_workers_per_gather")


def _without_parallel_workers(session, stmt, scalars: bool) -> list:
    """``stmt``'s rows, read on PostgreSQL with no parallel workers; later reads get them back."""
    if not outside_transaction(session):
        session.execute(_NO_PARALLEL_WORKERS)
        result = session.execute(stmt)
        rows = (result.scalars() if scalars else result).all()
        session.execute(_DEFAULT_PARALLEL_WORKERS)
        return rows
    session.execute(_NO_PARALLEL_WORKERS_HERE)
    try:
        result = session.execute(stmt)
        return (result.scalars() if scalars else result).all()
    finally:
        session.execute(_RESET_PARALLEL_WORKERS)


def keyset_page(session, stmt, time_column, id_column, *, limit: int, cursor: str | None,
                to_item, descending: bool = True, scalars: bool = False) -> Page:
    """One page of ``stmt`` in (time, id) order after ``cursor``, with the next page's cursor.

    Reads ``limit + 1`` rows to know whether another page exists; the cursor is the last row's
    (time, id), so pages stay stable while new rows arrive.
    """
    if cursor:
        moment, last_id = decode_cursor(cursor, 2)
        stmt = stmt.where(after_cursor(time_column, id_column, parse_time(moment), last_id,
                                       descending=descending))
    order = (time_column.desc(), id_column.desc()) if descending else (time_column, id_column)
    page = stmt.order_by(*order).limit(limit + 1)
    if session.get_bind().dialect.name == "postgresql":
        # A page is limit + 1 rows off an index range, but over a long history the planner's
        # cost for the whole range crosses the parallel-query threshold and it starts workers
        # to read them: 4.8 ms at 1M runs became 30 ms at 5M (6 ms without workers).
        rows = _without_parallel_workers(session, page, scalars)
    else:
        result = session.execute(page)
        rows = (result.scalars() if scalars else result).all()
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more:
        last = rows[-1]
        next_cursor = encode_cursor(getattr(last, time_column.key), getattr(last, id_column.key))
    return Page([to_item(r) for r in rows], next_cursor)
