"""What an API view asks of its request: the caller, its owner scope, replica-aware single reads."""

from __future__ import annotations

from flask import g

from agentledger.web.app_state import state


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
