"""Cancel requests, which cascade to every non-terminal descendant of the run."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core import dialect
from agentledger.core.errors import NotFound, RunTerminal
from agentledger.core.schema import AgentRun
from agentledger.core.vocabulary import TERMINAL
from ingest.events import append_events, lock_run_and_parent
from queries.visibility import may_see


def _children(session: Session, parents: list[str]) -> list[str]:
    """The runs whose parent is one of ``parents``, in id order (the order every cancel locks
    siblings in). Read once ``parents`` are locked and cancelling: a child created under one of
    them either committed before that lock (and is read here) or waited for it and then found
    its parent cancelling (and was refused), so none escapes the cascade."""
    return list(session.execute(
        select(AgentRun.id).where(AgentRun.parent_run_id.in_(parents)).order_by(AgentRun.id)
    ).scalars())


def _cancel_one(session: Session, run_id: str, requested_by: str) -> tuple[str, str]:
    """Cancel one run under its lock; (its status under the lock, its status afterwards)."""
    status = lock_run_and_parent(session, run_id).status
    if status == "queued":
        return status, append_events(
            session,
            run_id,
            [("run.cancelled", {"external_stop_confirmed": True, "before_start": True,
                                "requested_by": requested_by})],
        ).status
    if status == "running":
        after = append_events(
            session, run_id, [("run.cancelling", {"requested_by": requested_by})]
        ).status
        dialect.notify(session, dialect.CANCEL_CHANNEL, run_id)
        return status, after
    return status, status


def request_cancel(
    session: Session, run_id: str, *, requested_by: str, visible_to: str | None = None
) -> str:
    """Cancel a run and its subtree; returns the run's status afterwards.

    A queued run is ``cancelled`` at once; a running one becomes ``cancelling`` and its executor
    confirms with ``run.cancelled``. Repeating the request is harmless; a terminal run raises
    ``RunTerminal``. A run that ``visible_to`` may not see (another owner's, or one of a deleted
    session) is ``NotFound``, exactly as on the read side.
    """
    root_run_id = session.execute(
        select(AgentRun.root_run_id).where(AgentRun.id == run_id)
    ).scalar_one_or_none()
    if root_run_id is None or not may_see(session, "run", run_id, visible_to):
        raise NotFound(f"run {run_id} does not exist")
    # Decided on the status read under the lock: an executor may confirm or finish the run
    # between the read above and the lock, and then the run has ended before this request.
    locked, status = _cancel_one(session, run_id, requested_by)
    if locked in TERMINAL:
        raise RunTerminal(f"run {run_id} has already ended ({locked})")
    # Top-down, a level at a time (ancestors are locked before descendants, as by every
    # writer), each level read only after the one above it is locked.
    level = [run_id]
    while level := _children(session, level):
        for descendant in level:
            _cancel_one(session, descendant, requested_by)
    return status
