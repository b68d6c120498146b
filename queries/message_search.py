"""Which assistant answers match this text, session, owner, agent (and version) and time window?

Newest first, one keyset page at a time (``next_cursor`` is set when more rows match). Each item
names the run that produced the answer and the agent name and version frozen in that run's
snapshot, so an old answer is found under the agent as it was when it answered. The content is
a preview; the whole answer is in its provenance (``queries.provenance``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agentledger.core import read_sql as _dialect
from agentledger.core.schema import AgentRun, Message
from queries.common import (
    DEFAULT_LIMIT,
    Page,
    TimeWindow,
    clamp_limit,
    iso,
    keyset_page,
)

PREVIEW_CHARS = 280


@dataclass(frozen=True)
class MessageSearch:
    """Every given field narrows the search; ``text`` is a case-insensitive substring."""

    text: str | None = None
    session_id: str | None = None
    owner_id: str | None = None
    agent_id: str | None = None
    agent_version: int | None = None
    run_id: str | None = None
    context_item_id: str | None = None
    context_sha256: str | None = None
    window: TimeWindow = TimeWindow()


def _item(row) -> dict[str, Any]:
    preview = row.preview or ""
    return {
        "id": row.id,
        "content_preview": preview[:PREVIEW_CHARS],
        "content_truncated": len(preview) > PREVIEW_CHARS,
        "created_at": iso(row.created_at),
        "session_id": row.session_id,
        "owner_id": row.owner_id,
        "run_id": row.run_id,
        "run_status": row.status,
        "agent_id": row.agent_id,
        "agent_name": row.agent_name,
        "agent_version": row.agent_version,
    }


def search_messages(
    session: Session, search: MessageSearch, *, limit: int = DEFAULT_LIMIT, cursor: str | None = None
) -> Page:
    """One page of matching answers, newest first."""
    limit = clamp_limit(limit)
    stmt = (
        select(
            Message.id,
            func.substr(Message.content, 1, PREVIEW_CHARS + 1).label("preview"),
            Message.created_at,
            Message.session_id,
            Message.owner_id,
            Message.run_id,
            AgentRun.status,
            AgentRun.agent_id,
            AgentRun.agent_version,
            AgentRun.agent_execution_snapshot["name"].as_string().label("agent_name"),
        )
        .join(AgentRun, AgentRun.id == Message.run_id)
        .where(Message.role == "assistant", *search.window.conditions(Message.created_at))
    )
    if search.text:
        stmt = stmt.where(Message.content.icontains(search.text, autoescape=True))
    for column, value in (
        (Message.session_id, search.session_id),
        (Message.owner_id, search.owner_id),
        (Message.run_id, search.run_id),
        (AgentRun.agent_id, search.agent_id),
        (AgentRun.agent_version, search.agent_version),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    if search.context_item_id is not None:
        stmt = stmt.where(
            _dialect.context_pack_has_item(session, search.context_item_id, search.context_sha256)
        )
    return keyset_page(session, stmt, Message.created_at, Message.id, limit=limit,
                       cursor=cursor, to_item=_item)

