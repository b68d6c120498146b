"""What an API view asks of its request: the caller, its owner scope, replica-aware single reads."""

from __future__ import annotations

from flask import g

from agentledger.core.errors import NotFound
from agentledger.web.app_state import state
from queries.archived_runs import archived_run, archived_run_sentence


def principal():
    return g.principal


def owner_scope() -> str | None:
    """The owner whose objects the caller is limited to (None for viewers and admins, and for
    executors, which reach only the run routes that let them follow any run)."""
    p = g.principal
    return None if p.sees_everything or p.role == "executor" else p.owner_id


def read_one(query, *args, **kwargs):
    """Run a single-object query on the read replica; if it finds nothing and a replica is
    configured, ask the primary too: an object created a moment ago may not have replicated
    yet, and "not found" must mean it does not exist."""
    db = state().db
    with db.read() as s:
        found = query(s, *args, **kwargs)
    if found is None and db.read_url is not None:
        with db.read(primary=True) as s:
            found = query(s, *args, **kwargs)
    return found


def actor():
    """The caller as the admin action log names it."""
    from ingest.admin_log import Actor

    p = g.principal
    return Actor(name=p.owner_id, role=p.role)


def run_not_found(run_id: str) -> NotFound:
    """The 404 for a run the caller cannot read. A viewer or admin (who sees every run) asking
    for one that was archived learns when and into which file; to anyone else an archived run
    is one that does not exist (the record does not say whose it was)."""
    if g.principal.sees_everything:
        record = read_one(archived_run, run_id)
        if record is not None:
            return NotFound(archived_run_sentence(record))
    return NotFound(f"run {run_id} does not exist")
