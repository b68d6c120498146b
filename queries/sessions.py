"""Which sessions does this caller have, and what was said in one of them, by whom?"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core.schema import AgentRun, ChatSession, Message
from queries.common import (
    DEFAULT_LIMIT,
    Page,
    iso,
    keyset_page,
)
from queries.visibility import session_visible_to


def session_dict(row) -> dict[str, Any]:
    return {
        "id": row.id,
        "title": row.title,
        "agent_id": row.agent_id,
        "owner_id": row.owner_id,
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
        "deleted_at": iso(row.deleted_at),
    }


def _visible(stmt, visible_to: str | None):
    if visible_to is not None:
        stmt = stmt.where(session_visible_to(visible_to))
    return stmt


def get_session(session: Session, session_id: str, *, visible_to: str | None = None) -> dict | None:
    """The session, or None (deleted sessions are gone for their owner, kept for auditors)."""
    row = session.execute(
        _visible(select(ChatSession).where(ChatSession.id == session_id), visible_to)
    ).scalar_one_or_none()
    return session_dict(row) if row is not None else None


def list_sessions(
    session: Session, *, visible_to: str | None = None, limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> Page:
    """Newest first."""
    stmt = _visible(select(ChatSession), visible_to)
    return keyset_page(session, stmt, ChatSession.created_at, ChatSession.id, limit=limit,
                       cursor=cursor, to_item=session_dict, scalars=True)


def session_messages(
    session: Session, session_id: str, *, visible_to: str | None = None,
    limit: int = DEFAULT_LIMIT, cursor: str | None = None,
) -> Page | None:
    """The conversation in order. An answer's agent name and version come from the snapshot
    of the run that produced it, so later renames or agent switches never rewrite history."""
    if get_session(session, session_id, visible_to=visible_to) is None:
        return None
    stmt = (
        select(
            Message.id, Message.role, Message.content, Message.created_at, Message.run_id,
            AgentRun.agent_id, AgentRun.agent_execution_snapshot,
        )
        .join(AgentRun, AgentRun.id == Message.run_id)
        .where(Message.session_id == session_id)
    )
    return keyset_page(session, stmt, Message.created_at, Message.id, limit=limit, cursor=cursor,
                       to_item=_history_item, descending=False)


def _history_item(r) -> dict[str, Any]:
    return {
        "id": r.id,
        "role": r.role,
        "content": r.content,
        "created_at": iso(r.created_at),
        "run_id": r.run_id,
        "agent_id": r.agent_id,
        "agent_name": r.agent_execution_snapshot.get("name"),
        "agent_version": r.agent_execution_snapshot.get("version"),
    }
