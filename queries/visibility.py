"""Who may see which object: the one rule that every read and every write applies.

A caller with an owner scope (role ``user``) sees its own sessions while they are not deleted,
and its own runs (child runs included) unless the root run's session was deleted; a message is
visible exactly when the run that it belongs to is. Viewers, admins and executors pass no scope
(``None``) and see everything. The API answers ``404 not_found`` for anything this rule hides,
on GET and on every write route alike (cancel, PATCH/DELETE session, post message), so a caller
cannot learn from a write that an object exists.
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy import ColumnElement, and_, exists, select, true
from sqlalchemy.orm import Session, aliased

from agentledger.core.schema import AgentRun, ChatSession, Message

# Built once: an alias copies every column of the table, which costs more than the query
# around it (it ran on each stream wake-up and each owner-scoped read).
_ROOT_RUN = aliased(AgentRun, name="root_run")

Kind = Literal["run", "session", "message"]


def run_visible_to(owner_id: str | ColumnElement[str]):
    """SQL condition: the run is this owner's and its root run's session was not deleted.

    A deleted session disappears for its owner together with its runs (child runs included);
    viewers and admins still see everything (they pass no owner). ``owner_id`` may be a bound
    parameter of a statement built once.
    """
    root = _ROOT_RUN
    return and_(
        AgentRun.owner_id == owner_id,
        ~exists(
            select(1)
            .select_from(root)
            .join(ChatSession, ChatSession.id == root.session_id)
            .where(root.id == AgentRun.root_run_id, ChatSession.deleted_at.is_not(None))
        ),
    )


def session_visible_to(owner_id: str | ColumnElement[str]):
    """SQL condition: the session is this owner's and not deleted (``owner_id`` may be a SQL
    expression, such as a bound parameter of a cached statement)."""
    return and_(ChatSession.owner_id == owner_id, ChatSession.deleted_at.is_(None))


def may_see(session: Session, kind: Kind, object_id: str, visible_to: str | None) -> bool:
    """Whether the caller limited to owner ``visible_to`` (None: no limit) may see the object;
    False also when it does not exist."""
    if kind == "run":
        stmt = select(AgentRun.id).where(
            AgentRun.id == object_id, run_visible_to(visible_to) if visible_to else true())
    elif kind == "session":
        stmt = select(ChatSession.id).where(
            ChatSession.id == object_id, session_visible_to(visible_to) if visible_to else true())
    elif kind == "message":
        stmt = (select(Message.id).join(AgentRun, AgentRun.id == Message.run_id)
                .where(Message.id == object_id,
                       run_visible_to(visible_to) if visible_to else true()))
    else:  # pragma: no cover - the Literal names every kind
        raise ValueError(f"unknown kind {kind!r}")
    return session.execute(stmt).first() is not None
