"""Registering agents and adding immutable versions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agentledger.core import dialect
from agentledger.core.errors import Conflict, NotFound, ValidationFailed
from agentledger.core.hashing import agent_content_hash, storable_json
from agentledger.core.schema import Agent, AgentVersion
from agentledger.core.vocabulary import EXTERNAL_KIND


@dataclass(frozen=True)
class AgentDefinition:
    name: str
    kind: str
    model: str | None = None
    instructions: str | None = None
    tools: list[Any] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def content_hash(self) -> str:
        return agent_content_hash(self.name, self.kind, self.model, self.instructions,
                                  self.tools, self.params)


def check_runnable(agent_id: str, kind: str) -> None:
    """Refuse work for an agent the ledger cannot execute: one of kind ``external`` runs
    elsewhere and is recorded from its traces, so a run for it would wait in the queue until
    an executor failed it. Sessions, messages and delegations name it up front instead."""
    if kind == EXTERNAL_KIND:
        raise ValidationFailed(
            f"agent {agent_id!r} is of kind {EXTERNAL_KIND!r}: it runs elsewhere and its runs are "
            "recorded from its traces (OTLP), so the ledger cannot run it; choose another agent")


def _insert_version(session: Session, agent_id: str, version: int, definition: AgentDefinition, now) -> None:
    session.execute(
        insert(AgentVersion).values(
            agent_id=agent_id,
            version=version,
            name=definition.name,
            kind=definition.kind,
            model=definition.model,
            instructions=definition.instructions,
            tools=definition.tools,
            params=definition.params,
            content_hash=definition.content_hash(),
            created_at=now,
        )
    )


def _storable(definition: AgentDefinition) -> AgentDefinition:
    """The definition exactly as the database will give it back (so its hash stays true)."""
    return AgentDefinition(
        name=storable_json(definition.name, "name"),
        kind=storable_json(definition.kind, "kind"),
        model=storable_json(definition.model, "model"),
        instructions=storable_json(definition.instructions, "instructions"),
        tools=storable_json(definition.tools, "tools"),
        params=storable_json(definition.params, "params"),
    )


def register_agent(session: Session, agent_id: str, definition: AgentDefinition) -> int:
    """Create the agent with version 1; an existing id is a ``Conflict``."""
    definition = _storable(definition)
    now = dialect.now(session)
    stmt = dialect.insert_ignoring_conflicts(session, Agent.__table__, ["id"]).values(
        id=agent_id, latest_version=1, created_at=now, updated_at=now
    ).returning(Agent.id)
    if session.execute(stmt).first() is None:
        raise Conflict(f"agent {agent_id!r} already exists; use PUT to add a version")
    try:
        _insert_version(session, agent_id, 1, definition, now)
    except IntegrityError as exc:  # pragma: no cover - guarded by the insert above
        raise Conflict(f"agent {agent_id!r} already exists") from exc
    return 1


def add_agent_version(session: Session, agent_id: str, definition: AgentDefinition) -> int:
    """Append the next immutable version of an existing agent and make it the current one."""
    definition = _storable(definition)
    now = dialect.now(session)
    current = session.execute(
        dialect.for_update(select(Agent.latest_version).where(Agent.id == agent_id), session)
    ).scalar_one_or_none()
    if current is None:
        raise NotFound(f"agent {agent_id!r} does not exist")
    version = current + 1
    _insert_version(session, agent_id, version, definition, now)
    session.execute(
        update(Agent).where(Agent.id == agent_id).values(latest_version=version, updated_at=now)
    )
    return version
