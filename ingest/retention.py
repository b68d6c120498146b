"""Retention: moving old, finished run trees out of the live tables into archive files.

A tree is archived whole (its root and every descendant), and only when every run in it has
ended and the root ended before the cutoff, so what remains is always a set of complete trees
whose chains ``agentledger verify`` still checks. For each run the transaction first records
``archived_run`` (file, chain head) — which is what lets the database triggers allow deleting
that run's events — then deletes its events, messages and run row. The caller writes the
archive lines (``export_trees``) and flushes them before committing the deletion
(``delete_trees``), so a run is never gone from both places.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, delete, exists, func, insert, select
from sqlalchemy.orm import Session, aliased

from agentledger.core import dialect
from agentledger.core.archive_format import archive_time_text
from agentledger.core.schema import (
    AgentRun,
    ArchivedRun,
    ChatSession,
    ConversationThread,
    Message,
    OtlpSpan,
    RunEvent,
)
from agentledger.core.vocabulary import NON_TERMINAL, TERMINAL


def _iso(value: datetime | None) -> str | None:
    return archive_time_text(value) if value is not None else None


def archivable_roots(session: Session, *, finished_before: datetime, limit: int | None,
                     claim: bool = False) -> list[str]:
    """Root runs that ended before the cutoff and whose whole tree has ended, oldest first.

    ``claim``: for the transaction that archives them. On PostgreSQL their rows are locked and
    roots another archive run holds are skipped (``FOR UPDATE SKIP LOCKED``), so two archive
    runs at once share the trees instead of both exporting the same ones (one of them then
    wrote lines for trees the other had already deleted). SQLite's writers take turns anyway."""
    descendant = aliased(AgentRun)
    stmt = (
        select(AgentRun.id)
        .where(
            AgentRun.parent_run_id.is_(None),
            AgentRun.status.in_(TERMINAL),
            AgentRun.finished_at < finished_before,
            ~exists().where(descendant.root_run_id == AgentRun.id,
                            descendant.status.in_(NON_TERMINAL)),
        )
        .order_by(AgentRun.finished_at, AgentRun.id)
        .limit(limit)
    )
    if claim:
        stmt = stmt.with_for_update(skip_locked=True, of=AgentRun)
    return list(session.execute(stmt).scalars())


def export_trees(session: Session, root_ids: list[str]) -> list[dict[str, Any]]:
    """One JSON-ready record per run of these trees: the run row, its messages, its events."""
    if not root_ids:
        return []
    runs = session.execute(
        select(AgentRun).where(AgentRun.root_run_id.in_(root_ids))
        .order_by(AgentRun.root_run_id, AgentRun.created_at, AgentRun.id)
    ).scalars().all()
    run_ids = [r.id for r in runs]
    events: dict[str, list] = {r: [] for r in run_ids}
    for row in session.execute(
        select(RunEvent.run_id, RunEvent.seq, RunEvent.type, RunEvent.data, RunEvent.created_at,
               RunEvent.hash)
        .where(RunEvent.run_id.in_(run_ids)).order_by(RunEvent.run_id, RunEvent.seq)
    ):
        events[row.run_id].append({"seq": row.seq, "type": row.type, "data": row.data,
                                   "created_at": _iso(row.created_at), "hash": row.hash})
    messages: dict[str, list] = {r: [] for r in run_ids}
    for m in session.execute(
        select(Message).where(Message.run_id.in_(run_ids)).order_by(Message.created_at)
    ).scalars():
        messages[m.run_id].append({"id": m.id, "session_id": m.session_id, "thread_id": m.thread_id,
                                   "owner_id": m.owner_id, "role": m.role, "content": m.content,
                                   "created_at": _iso(m.created_at)})
    records = []
    for r in runs:
        columns = {c.key: getattr(r, c.key) for c in AgentRun.__table__.columns}
        run_record = {k: (_iso(v) if isinstance(v, datetime) else v) for k, v in columns.items()}
        records.append({"run": run_record, "messages": messages[r.id], "events": events[r.id]})
    return records


def delete_trees(session: Session, records: list[dict[str, Any]], archive_file: str) -> int:
    """Record the runs as archived, then delete their rows; returns the number of runs."""
    if not records:
        return 0
    now = dialect.now(session)
    run_ids = [rec["run"]["id"] for rec in records]
    session.execute(insert(ArchivedRun), [
        {"run_id": rec["run"]["id"], "root_run_id": rec["run"]["root_run_id"],
         "archive_file": archive_file, "last_event_seq": rec["run"]["last_event_seq"],
         "last_event_hash": rec["run"]["last_event_hash"],
         "finished_at": datetime.fromisoformat(rec["run"]["finished_at"])
         if rec["run"]["finished_at"] else None,
         "archived_at": now}
        for rec in records
    ])
    session.execute(delete(RunEvent).where(RunEvent.run_id.in_(run_ids)))
    session.execute(delete(Message).where(Message.run_id.in_(run_ids)))
    child_threads = [rec["run"]["thread_id"] for rec in records if rec["run"]["session_id"] is None]
    session.execute(delete(AgentRun).where(AgentRun.id.in_(run_ids)))
    if child_threads:
        # A delegated run's thread belonged to it alone; a session's thread stays with the session.
        session.execute(
            delete(ConversationThread).where(
                ConversationThread.id.in_(child_threads),
                ~exists().where(AgentRun.thread_id == ConversationThread.id),
                ~exists().where(ChatSession.thread_id == ConversationThread.id),
                ~exists().where(Message.thread_id == ConversationThread.id),
            )
        )
    return len(run_ids)


def prunable_otlp_traces(session: Session, *, received_before: datetime, limit: int | None,
                         after: str = "") -> list[str]:
    """OTLP traces whose buffered spans are no longer needed, in trace id order after
    ``after``: every span settled (recorded in a run, or ``""``: kept but never recorded), the
    newest received before the cutoff, and no run they were recorded in still in ``agent_run``
    (archived, or never written).

    Until then the spans are what makes a re-export write nothing and a late span be reported as
    late, so they stay as long as their runs stay in the live tables. Walking the primary key in
    order with ``after`` as the cursor reads the buffer once over all the batches."""
    return list(session.execute(
        select(OtlpSpan.trace_id)
        .outerjoin(AgentRun, AgentRun.id == OtlpSpan.run_id)
        .where(OtlpSpan.trace_id > after)
        .group_by(OtlpSpan.trace_id)
        .having(func.max(OtlpSpan.received_at) < received_before,
                func.count(OtlpSpan.run_id) == func.count(),  # no span still waiting
                func.count(AgentRun.id) == 0)
        .order_by(OtlpSpan.trace_id)
        .limit(limit)
    ).scalars())


def prune_otlp_spans(session: Session, trace_ids: list[str], *, received_before: datetime) -> int:
    """Delete the buffered spans of these traces received before the cutoff (a span that
    arrives meanwhile is newer, so it stays and is handled like any late span)."""
    if not trace_ids:
        return 0
    result = session.execute(delete(OtlpSpan).where(OtlpSpan.trace_id.in_(trace_ids),
                                                    OtlpSpan.received_at < received_before))
    return cast(CursorResult, result).rowcount
