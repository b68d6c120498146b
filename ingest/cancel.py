"""Cancel requests, which cascade to every non-terminal descendant of the run."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core.errors import NotFound, RunTerminal
from agentledger.core.schema import AgentRun
from agentledger.core.vocabulary import TERMINAL
from ingest.events import append_events, lock_run_and_parent
from queries.visibility import may_see


def _subtree_top_down(session: Session, run_id: str, root_run_id: str) -> list[str]:
    """The run's descendants, parents before children (the lock order every writer keeps)."""
    rows = session.execute(
        select(AgentRun.id, AgentRun.parent_run_id).where(AgentRun.root_run_id == root_run_id)
    ).all()
    children: dict[str, list[str]] = {}
    for row in rows:
        if row.parent_run_id:
            children.setdefault(row.parent_run_id, []).append(row.id)
    ordered, frontier = [], [run_id]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(children.get(node, [])):
                ordered.append(child)
                nxt.append(child)
        frontier = nxt
    return ordered


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
        return status, append_events(
            session, run_id, [("run.cancelling", {"requested_by": requested_by})]
        ).status
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
    for descendant in _subtree_top_down(session, run_id, root_run_id):
        _cancel_one(session, descendant, requested_by)
    return status
