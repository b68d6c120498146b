"""The admin action log: one append-only row per administrative action, written by the entry
point in the same transaction as the action itself (so a refused action leaves no entry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from agentledger.core import dialect
from agentledger.core.hashing import storable_json
from agentledger.core.ids import new_id
from agentledger.core.schema import AdminAction
from agentledger.core.vocabulary import ADMIN_ACTIONS

ACTIONS = ADMIN_ACTIONS


@dataclass(frozen=True)
class Actor:
    name: str
    role: str


def record(session: Session, actor: Actor, action: str, target_type: str, target_id: str,
           detail: dict[str, Any] | None = None) -> str:
    if action not in ACTIONS:
        raise ValueError(f"unknown admin action {action!r}")
    action_id = new_id("act")
    session.execute(insert(AdminAction).values(
        id=action_id, at=dialect.now(session), actor=actor.name, actor_role=actor.role,
        action=action, target_type=target_type, target_id=target_id,
        detail=storable_json(detail or {}, "detail"),
    ))
    return action_id
