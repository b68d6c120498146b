"""What was in a run's memory: the earlier turns of its thread (CONTRACT §7).

A run's history is the user message of every earlier run of its thread and the answer of each
that succeeded, oldest first, at most ``params.history_limit`` turns (default 50), the newest
kept. Runs of a thread execute first in first out, so every earlier run has ended when a run
starts and this answer never changes afterwards: the executor reads it when it claims the run,
and the provenance page reads the same turns again later.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, bindparam, case, or_, select, tuple_
from sqlalchemy.orm import Session

from agentledger.core.agent_params import history_limit
from agentledger.core.database import execute
from agentledger.core.schema import AgentRun, Message
from queries.common import iso

# The four keys an agent sees of a turn; the provenance answer adds ``message_id``.
TURN_KEYS = ("role", "content", "run_id", "created_at")


_RUN = select(AgentRun.thread_id, AgentRun.created_at, AgentRun.agent_execution_snapshot).where(
    AgentRun.id == bindparam("run_id"))
# Built once (every claim reads it): the newest ``limit`` turns of the thread before the run.
_TURNS_BEFORE = (
    select(Message.id, Message.role, Message.content, Message.run_id, Message.created_at)
    .join(AgentRun, AgentRun.id == Message.run_id)
    .where(
        AgentRun.thread_id == bindparam("thread_id"),
        tuple_(AgentRun.created_at, AgentRun.id) < tuple_(
            bindparam("created_at", type_=AgentRun.created_at.type),
            bindparam("run_id", type_=AgentRun.id.type)),
        or_(Message.role == "user",
            and_(Message.role == "assistant", AgentRun.status == "succeeded")),
    )
    .order_by(AgentRun.created_at.desc(), AgentRun.id.desc(),
              case((Message.role == "user", 0), else_=1).desc())
    .limit(bindparam("limit"))
)


def thread_history(session: Session, run_id: str, *, limit: int | None = None) -> list[dict[str, Any]]:
    """The turns before ``run_id`` on its thread, oldest first, each ``{"role", "content",
    "run_id", "created_at", "message_id"}``; ``limit`` defaults to the run's frozen
    ``params.history_limit``. Empty for an unknown run and for a thread's first run (a child
    run's thread is its own, so a child always starts empty)."""
    run = execute(session, _RUN, {"run_id": run_id}).one_or_none()
    if run is None:
        return []
    if limit is None:
        limit = history_limit((run.agent_execution_snapshot or {}).get("params"))
    if limit <= 0:
        return []
    rows = execute(session, _TURNS_BEFORE, {"thread_id": run.thread_id, "created_at": run.created_at,
                                           "run_id": run_id, "limit": limit}).all()
    return [
        {"role": r.role, "content": r.content, "run_id": r.run_id,
         "created_at": iso(r.created_at), "message_id": r.id}
        for r in reversed(rows)
    ]


def as_turns(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns as an agent receives them (CONTRACT §7's four keys)."""
    return [{k: turn[k] for k in TURN_KEYS} for turn in history]
