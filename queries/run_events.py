"""What happened in this run, in order, after a given seq?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, and_, bindparam, select
from sqlalchemy.orm import Session

from agentledger.core.database import execute
from agentledger.core.schema import AgentRun, RunEvent
from agentledger.core.vocabulary import TERMINAL
from queries.common import iso, run_visible_to


@dataclass(frozen=True)
class EventsPage:
    run_id: str
    events: list[dict[str, Any]]
    next_after_seq: int
    status: str
    terminal: bool
    last_event_seq: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "events": self.events,
            "next_after_seq": self.next_after_seq,
            "status": self.status,
            "terminal": self.terminal,
        }


def event_dict(row) -> dict[str, Any]:
    return {"seq": row.seq, "type": row.type, "data": row.data, "created_at": iso(row.created_at)}


# Built once: an event stream re-reads the page after every notification, and a statement
# built per call costs more Python than the read itself (construction and SQLAlchemy's cache
# key walk of the visibility subquery); a constant one memoizes its key.
_HEAD = select(AgentRun.status, AgentRun.last_event_seq).where(AgentRun.id == bindparam("run_id"))
_VISIBLE_HEAD = _HEAD.where(run_visible_to(bindparam("owner_id")))


def _page(head):
    """The run's head with its next events in one statement (one round trip, one snapshot):
    seqs are gapless, so the ``limit`` events after ``after_seq`` are exactly the seqs
    ``after_seq + 1 … until_seq`` (``after_seq + limit``). No event: one row with null event columns; a run
    that is not there (or not visible): no row."""
    return (
        head.add_columns(RunEvent.seq, RunEvent.type, RunEvent.data, RunEvent.created_at)
        .outerjoin(RunEvent, and_(RunEvent.run_id == AgentRun.id,
                                  RunEvent.seq > bindparam("after_seq"),
                                  # bigint: after_seq + limit may pass the column's int32
                                  RunEvent.seq <= bindparam("until_seq", type_=BigInteger)))
        .order_by(RunEvent.seq)
    )


_PAGE = _page(_HEAD)
_VISIBLE_PAGE = _page(_VISIBLE_HEAD)


def events_page(
    session: Session, run_id: str, *, after_seq: int = 0, limit: int = 50,
    visible_to: str | None = None,
) -> EventsPage | None:
    """Up to ``limit`` events with seq > ``after_seq``; None if the run is not visible.

    The run's status and its events are read in one statement, so a page never claims
    ``terminal`` unless the terminal event is in it (the status changes in the same
    transaction as the terminal event is written).
    """
    stmt, params = events_page_read(run_id, after_seq=after_seq, limit=limit,
                                    visible_to=visible_to)
    return events_page_of(execute(session, stmt, params).all(), run_id, after_seq)


def events_page_read(run_id: str, *, after_seq: int = 0, limit: int = 50,
                     visible_to: str | None = None) -> tuple[Any, dict[str, Any]]:
    """``events_page``'s one statement and its parameters, for a caller that runs it itself
    (an event stream, through ``Database.read_rows``); ``events_page_of`` makes the page."""
    params = {"run_id": run_id, "after_seq": after_seq, "until_seq": after_seq + limit}
    if visible_to is None:
        return _PAGE, params
    return _VISIBLE_PAGE, {**params, "owner_id": visible_to}


def events_page_of(rows, run_id: str, after_seq: int) -> EventsPage | None:
    """The page that ``events_page_read``'s rows make (None: the run is not visible)."""
    if not rows:
        return None
    head = rows[0]
    events = [event_dict(r) for r in rows if r.seq is not None]
    next_after = events[-1]["seq"] if events else after_seq
    terminal = head.status in TERMINAL and next_after >= head.last_event_seq
    return EventsPage(run_id, events, next_after, head.status, terminal, head.last_event_seq)
