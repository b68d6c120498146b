"""Which runs make up this run's delegation tree, and how did each go?

Rebuilt from rows alone (``root_run_id``, ``parent_run_id``): one indexed read of the root's
runs, ordered parents before children.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from agentledger.core.database import execute, read_one
from agentledger.core.schema import AgentRun
from queries.common import iso, run_visible_to

# Built once: the statements cost more to build and cache-key than to run.
_ROOT = select(AgentRun.root_run_id).where(AgentRun.id == bindparam("run_id"))
_VISIBLE_ROOT = _ROOT.where(run_visible_to(bindparam("owner_id")))
_NODES = (
    select(AgentRun.id, AgentRun.parent_run_id, AgentRun.agent_id,
           AgentRun.agent_execution_snapshot, AgentRun.status, AgentRun.created_at,
           AgentRun.started_at, AgentRun.finished_at)
    .where(AgentRun.root_run_id == bindparam("root_id"))
    .order_by(AgentRun.created_at, AgentRun.id)
)


def run_tree(session: Session, run_id: str, *, visible_to: str | None = None) -> dict[str, Any] | None:
    if visible_to is None:
        found = read_one(session, _ROOT, {"run_id": run_id})
    else:
        found = read_one(session, _VISIBLE_ROOT, {"run_id": run_id, "owner_id": visible_to})
    if found is None:
        return None
    root_id = found.root_run_id
    rows = execute(session, _NODES, {"root_id": root_id}).all()
    children: dict[str | None, list] = {}
    for row in rows:
        children.setdefault(row.parent_run_id, []).append(row)
    ordered, frontier = [], [r for r in rows if r.id == root_id]
    while frontier:
        ordered.extend(frontier)
        frontier = [c for node in frontier for c in children.get(node.id, [])]
    nodes = [
        {
            "run_id": r.id,
            "parent_run_id": r.parent_run_id,
            "agent_id": r.agent_id,
            "agent_name": r.agent_execution_snapshot.get("name"),
            "agent_version": r.agent_execution_snapshot.get("version"),
            "status": r.status,
            "events_url": f"/api/agent-runs/{r.id}/events",
            "created_at": iso(r.created_at),
            "started_at": iso(r.started_at),
            "finished_at": iso(r.finished_at),
        }
        for r in ordered
    ]
    return {"root_run_id": root_id, "nodes": nodes}
