"""What is this run, and which runs match these filters?"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from agentledger.core.database import read_one
from agentledger.core.schema import AgentRun
from queries.common import (
    DEFAULT_LIMIT,
    RUN_SUMMARY_COLUMNS,
    Page,
    keyset_page,
    run_summary,
    run_visible_to,
)

# Built once (the run route, which HTTP executors and clients poll while they follow a run, and
# the run page read it): a statement built per call, and the ORM's loading of an entity, cost
# more than the read.
_RUN = select(*RUN_SUMMARY_COLUMNS).where(AgentRun.id == bindparam("run_id"))
_VISIBLE_RUN = _RUN.where(run_visible_to(bindparam("owner_id")))


def get_run(session: Session, run_id: str, *, visible_to: str | None = None,
            admin: bool = False) -> dict[str, Any] | None:
    """The run as the API shows it, or None when it does not exist (or is not the owner's).

    ``admin`` adds what only admins see: ``redaction_count``."""
    if visible_to is None:
        row = read_one(session, _RUN, {"run_id": run_id})
    else:
        row = read_one(session, _VISIBLE_RUN, {"run_id": run_id, "owner_id": visible_to})
    if row is None:
        return None
    found = run_summary(row)
    if admin:
        found["redaction_count"] = row.redaction_count
    return found


@dataclass(frozen=True)
class RunFilters:
    status: str | None = None
    agent_id: str | None = None
    session_id: str | None = None
    root_run_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


def list_runs(
    session: Session,
    filters: RunFilters,
    *,
    visible_to: str | None = None,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> Page:
    """Runs matching every given filter, newest first, one page at a time."""
    stmt = select(AgentRun)
    if visible_to is not None:
        stmt = stmt.where(run_visible_to(visible_to))
    for column, value in (
        (AgentRun.status, filters.status),
        (AgentRun.agent_id, filters.agent_id),
        (AgentRun.session_id, filters.session_id),
        (AgentRun.root_run_id, filters.root_run_id),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    if filters.created_after is not None:
        stmt = stmt.where(AgentRun.created_at >= filters.created_after)
    if filters.created_before is not None:
        stmt = stmt.where(AgentRun.created_at < filters.created_before)
    return keyset_page(session, stmt, AgentRun.created_at, AgentRun.id, limit=limit,
                       cursor=cursor, to_item=run_summary, scalars=True)


def ledger_is_empty(session: Session) -> bool:
    """True when no run was ever recorded (``python app.py`` seeds demo data then)."""
    return session.execute(select(AgentRun.id).limit(1)).first() is None
