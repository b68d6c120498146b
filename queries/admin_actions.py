"""Who changed the ledger's configuration, and when? (the admin action log, newest first)"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core.schema import AdminAction
from queries.common import (
    DEFAULT_LIMIT,
    Page,
    clamp_limit,
    iso,
    keyset_page,
)


@dataclass(frozen=True)
class ActionFilters:
    action: str | None = None
    actor: str | None = None
    target_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def admin_actions(session: Session, filters: ActionFilters | None = None, *,
                  limit: int = DEFAULT_LIMIT, cursor: str | None = None) -> Page:
    filters = filters or ActionFilters()
    limit = clamp_limit(limit)
    stmt = select(AdminAction)
    for column, value in ((AdminAction.action, filters.action), (AdminAction.actor, filters.actor),
                          (AdminAction.target_id, filters.target_id)):
        if value is not None:
            stmt = stmt.where(column == value)
    if filters.since is not None:
        stmt = stmt.where(AdminAction.at >= filters.since)
    if filters.until is not None:
        stmt = stmt.where(AdminAction.at < filters.until)
    return keyset_page(session, stmt, AdminAction.at, AdminAction.id, limit=limit,
                       cursor=cursor, to_item=_item, scalars=True)


def _item(r) -> dict:
    return {"id": r.id, "at": iso(r.at), "actor": r.actor, "actor_role": r.actor_role,
            "action": r.action, "target_type": r.target_type, "target_id": r.target_id,
            "detail": r.detail}
