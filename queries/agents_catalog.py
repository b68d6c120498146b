"""Which agents exist, and what did each of their versions say?"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core.schema import Agent, AgentVersion
from queries.common import DEFAULT_LIMIT, Page, decode_cursor, encode_cursor, iso


def version_dict(row) -> dict[str, Any]:
    return {
        "version": row.version,
        "name": row.name,
        "kind": row.kind,
        "model": row.model,
        "instructions": row.instructions,
        "tools": row.tools,
        "params": row.params,
        "content_hash": row.content_hash,
        "created_at": iso(row.created_at),
    }


def _agent_dict(agent, current) -> dict[str, Any]:
    return {
        "id": agent.id,
        **version_dict(current),
        "created_at": iso(agent.created_at),
        "updated_at": iso(agent.updated_at),
    }


def _current(stmt):
    return stmt.join(
        AgentVersion,
        (AgentVersion.agent_id == Agent.id) & (AgentVersion.version == Agent.latest_version),
    )


def get_agent(session: Session, agent_id: str, *, with_versions: bool = True) -> dict | None:
    """The agent as its current version describes it, plus every version (oldest first)."""
    found = session.execute(
        _current(select(Agent, AgentVersion)).where(Agent.id == agent_id)
    ).one_or_none()
    if found is None:
        return None
    result = _agent_dict(*found)
    if with_versions:
        versions = session.execute(
            select(AgentVersion).where(AgentVersion.agent_id == agent_id).order_by(AgentVersion.version)
        ).scalars()
        result["versions"] = [version_dict(v) for v in versions]
    return result


def list_agents(session: Session, *, limit: int = DEFAULT_LIMIT, cursor: str | None = None) -> Page:
    """Agents by id."""
    stmt = _current(select(Agent, AgentVersion))
    if cursor:
        (last_id,) = decode_cursor(cursor, 1)
        stmt = stmt.where(Agent.id > last_id)
    rows = session.execute(stmt.order_by(Agent.id).limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return Page([_agent_dict(a, v) for a, v in rows], encode_cursor(rows[-1][0].id) if more else None)


def agent_choices(session: Session, text: str | None, *, limit: int) -> list[dict[str, str]]:
    """The id and current name of the agents whose id or name holds ``text`` (any case), the
    first ``limit`` by id."""
    stmt = _current(select(Agent.id, AgentVersion.name))
    if text:
        stmt = stmt.where(Agent.id.icontains(text, autoescape=True)
                          | AgentVersion.name.icontains(text, autoescape=True))
    rows = session.execute(stmt.order_by(Agent.id).limit(limit)).all()
    return [{"id": agent_id, "name": name} for agent_id, name in rows]


def version_times(session: Session) -> list[tuple[str, int, Any]]:
    """(agent id, version, created_at) of every agent version, oldest version first."""
    rows = session.execute(select(AgentVersion.agent_id, AgentVersion.version,
                                  AgentVersion.created_at)
                           .order_by(AgentVersion.agent_id, AgentVersion.version)).all()
    return [tuple(r) for r in rows]
