"""Who changed the ledger's configuration, and when? (the admin action log, newest first)"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.schema import AdminAction
from queries.common import (
    DEFAULT_LIMIT,
    Page,
    after_cursor,
    clamp_limit,
    decode_cursor,
    encode_cursor,
    iso,
    parse_time,
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
    if cursor:
        at, last_id = decode_cursor(cursor, 2)
        stmt = stmt.where(after_cursor(AdminAction.at, AdminAction.id, parse_time(at), last_id))
    rows = session.execute(
        stmt.order_by(AdminAction.at.desc(), AdminAction.id.desc()).limit(limit + 1)
    ).scalars().all()
    more = len(rows) > limit
    rows = rows[:limit]
    items = [{"id": r.id, "at": iso(r.at), "actor": r.actor, "actor_role": r.actor_role,
              "action": r.action, "target_type": r.target_type, "target_id": r.target_id,
              "detail": r.detail} for r in rows]
    return Page(items, encode_cursor(rows[-1].at, rows[-1].id) if more else None)
