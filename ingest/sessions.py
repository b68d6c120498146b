"""Chat sessions and their threads: creation, edits and soft deletion."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from agentledger.core import dialect
from agentledger.core.errors import NotFound, UnknownAgent
from agentledger.core.ids import new_id
from agentledger.core.schema import Agent, AgentVersion, ChatSession, ConversationThread
from ingest.agents import check_runnable
from queries.visibility import may_see

_UNSET = object()


def require_agent(session: Session, agent_id: str) -> None:
    """The agent a session's messages go to: registered, and one the ledger can run."""
    kind = session.execute(
        select(AgentVersion.kind)
        .join(Agent, (Agent.id == AgentVersion.agent_id)
              & (Agent.latest_version == AgentVersion.version))
        .where(Agent.id == agent_id)).scalar_one_or_none()
    if kind is None:
        raise UnknownAgent(f"agent {agent_id!r} is not registered")
    check_runnable(agent_id, kind)


def create_thread(session: Session, owner_id: str, now) -> str:
    thread_id = new_id("thr")
    session.execute(
        insert(ConversationThread).values(id=thread_id, owner_id=owner_id, created_at=now)
    )
    return thread_id


def create_session(session: Session, *, owner_id: str, agent_id: str, title: str | None) -> str:
    """A new session with its own new thread; returns the session id."""
    require_agent(session, agent_id)
    now = dialect.now(session)
    thread_id = create_thread(session, owner_id, now)
    session_id = new_id("sess")
    session.execute(
        insert(ChatSession).values(
            id=session_id,
            owner_id=owner_id,
            title=title,
            agent_id=agent_id,
            thread_id=thread_id,
            created_at=now,
            updated_at=now,
        )
    )
    return session_id


def _visible(session: Session, session_id: str, owner_id: str | None):
    """The live session, or ``NotFound``: one the caller limited to ``owner_id`` may not see
    (the rule of ``queries.visibility``), or a deleted one (which takes no writes from anyone)."""
    live = session.execute(
        select(ChatSession.id).where(ChatSession.id == session_id, ChatSession.deleted_at.is_(None))
    ).first()
    if live is None or not may_see(session, "session", session_id, owner_id):
        raise NotFound(f"session {session_id} does not exist")


def update_session(
    session: Session, session_id: str, *, owner_id: str | None, title: Any = _UNSET,
    agent_id: Any = _UNSET
) -> None:
    """Change the title and/or the default agent for the session's next messages."""
    _visible(session, session_id, owner_id)
    values = {}
    if title is not _UNSET:
        values["title"] = title
    if agent_id is not _UNSET:
        require_agent(session, agent_id)
        values["agent_id"] = agent_id
    values["updated_at"] = dialect.now(session)
    session.execute(update(ChatSession).where(ChatSession.id == session_id).values(**values))


def delete_session(session: Session, session_id: str, *, owner_id: str | None) -> None:
    """Hide the session from its owner; runs, messages and events stay for audit."""
    _visible(session, session_id, owner_id)
    now = dialect.now(session)
    session.execute(
        update(ChatSession)
        .where(ChatSession.id == session_id)
        .values(deleted_at=now, updated_at=now)
    )
