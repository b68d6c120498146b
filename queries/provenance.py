"""Which run, agent, agent version and context produced this answer?

Read from the producing run's frozen snapshots, never from today's agent or session settings.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.schema import AgentRun, ChatSession, Message
from queries.common import iso, run_summary, run_visible_to
from queries.sessions import session_dict


class UserMessage(Exception):
    """Provenance was asked of a user message."""


def message_provenance(
    session: Session, message_id: str, *, visible_to: str | None = None
) -> dict[str, Any] | None:
    """The auditor's answer in one call; None if the message is not visible.

    Raises ``UserMessage`` for a user's own message (only answers have a producer).
    """
    stmt = (
        select(Message, AgentRun)
        .join(AgentRun, AgentRun.id == Message.run_id)
        .where(Message.id == message_id)
    )
    if visible_to is not None:
        stmt = stmt.where(run_visible_to(visible_to))
    found = session.execute(stmt).one_or_none()
    if found is None:
        return None
    message, run = found
    if message.role != "assistant":
        raise UserMessage(message_id)
    chat = None
    if message.session_id is not None:
        chat = session.execute(
            select(ChatSession).where(ChatSession.id == message.session_id)
        ).scalar_one_or_none()
    snapshot = run.agent_execution_snapshot
    return {
        "message": {
            "id": message.id,
            "role": message.role,
            "content": message.content,
            "created_at": iso(message.created_at),
            "session_id": message.session_id,
            "run_id": message.run_id,
        },
        "run": run_summary(run),
        "agent": {"id": snapshot["agent_id"], "name": snapshot["name"], "version": snapshot["version"]},
        "agent_execution_snapshot": snapshot,
        "context_pack_snapshot": run.context_pack_snapshot,
        "session": session_dict(chat) if chat is not None else None,
    }
