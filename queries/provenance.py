"""Which run, agent, agent version and context produced this answer, and the reverse: which
answers did a given agent version or context item produce? How do two snapshots differ?

Read from the producing runs' frozen snapshots, never from today's agent or session settings.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from agentledger.core.database import read_one
from agentledger.core.schema import AgentRun, AgentVersion, ChatSession, Message
from queries.agents_catalog import version_dict
from queries.common import (
    DEFAULT_LIMIT,
    RUN_SUMMARY_COLUMNS,
    Page,
    iso,
    run_summary,
    run_visible_to,
)
from queries.message_search import MessageSearch, search_messages
from queries.sessions import session_dict
from queries.thread_history import thread_history


class UserMessage(Exception):
    """Provenance was asked of a user message."""


# Built once. The answer's session is an alias: ``run_visible_to``'s subquery names
# ``chat_session`` too, and would otherwise be correlated with it.
_CHAT = ChatSession.__table__.alias("answer_session")
_PROVENANCE = (
    select(Message.id.label("message_id"), Message.role.label("message_role"),
           Message.content.label("message_content"),
           Message.created_at.label("message_created_at"),
           Message.session_id.label("message_session_id"), Message.run_id.label("message_run_id"),
           *RUN_SUMMARY_COLUMNS,
           *(c.label(f"chat_{c.name}") for c in (
               _CHAT.c.id, _CHAT.c.title, _CHAT.c.agent_id, _CHAT.c.owner_id,
               _CHAT.c.created_at, _CHAT.c.updated_at, _CHAT.c.deleted_at)))
    .select_from(Message)
    .join(AgentRun, AgentRun.id == Message.run_id)
    .outerjoin(_CHAT, _CHAT.c.id == Message.session_id)
    .where(Message.id == bindparam("message_id"))
)
_VISIBLE_PROVENANCE = _PROVENANCE.where(run_visible_to(bindparam("owner_id")))
_SESSION_FIELDS = ("id", "title", "agent_id", "owner_id", "created_at", "updated_at", "deleted_at")


def message_provenance(
    session: Session, message_id: str, *, visible_to: str | None = None
) -> dict[str, Any] | None:
    """The auditor's answer in one call; None if the message is not visible.

    Raises ``UserMessage`` for a user's own message (only answers have a producer).
    """
    if visible_to is None:
        row = read_one(session, _PROVENANCE, {"message_id": message_id})
    else:
        row = read_one(session, _VISIBLE_PROVENANCE,
                       {"message_id": message_id, "owner_id": visible_to})
    if row is None:
        return None
    if row.message_role != "assistant":
        raise UserMessage(message_id)
    chat = None
    if row.chat_id is not None:
        chat = session_dict(SimpleNamespace(
            **{f: getattr(row, f"chat_{f}") for f in _SESSION_FIELDS}))
    snapshot = row.agent_execution_snapshot
    return {
        "message": {
            "id": row.message_id,
            "role": row.message_role,
            "content": row.message_content,
            "created_at": iso(row.message_created_at),
            "session_id": row.message_session_id,
            "run_id": row.message_run_id,
        },
        "run": run_summary(row),
        "agent": {"id": snapshot["agent_id"], "name": snapshot["name"], "version": snapshot["version"]},
        "agent_execution_snapshot": snapshot,
        "context_pack_snapshot": row.context_pack_snapshot,
        "session": chat,
        # What the producing run had in memory: its thread's earlier turns, with message ids.
        "history": thread_history(session, row.id),
    }


def messages_by_agent_version(
    session: Session, agent_id: str, version: int, *, limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> Page:
    """Answers produced by runs frozen on this agent version, newest first."""
    search = MessageSearch(agent_id=agent_id, agent_version=version)
    return search_messages(session, search, limit=limit, cursor=cursor)


def messages_by_context_item(
    session: Session, item_id: str, *, sha256: str | None = None, limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> Page:
    """Answers whose run could read this context item (this exact content, given its sha256)."""
    search = MessageSearch(context_item_id=item_id, context_sha256=sha256)
    return search_messages(session, search, limit=limit, cursor=cursor)


# Fields that restate others: the hash of the whole definition changes whenever any field does.
_DERIVED_FIELDS = ("content_hash", "created_at")


def diff_agent_snapshots(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Field-by-field changes between two agent definitions (execution snapshots or versions)."""
    fields = sorted((set(before) | set(after)) - set(_DERIVED_FIELDS))
    changes = [
        {"field": f, "before": before.get(f), "after": after.get(f)}
        for f in fields
        if before.get(f) != after.get(f)
    ]
    # Two versions with identical content are the same definition under another number.
    return {
        "same_definition": all(c["field"] == "version" for c in changes),
        "changes": changes,
    }


def diff_context_packs(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Items added, removed and changed (other content, title or version) between two packs."""
    old = {i["id"]: i for i in before.get("items", [])}
    new = {i["id"]: i for i in after.get("items", [])}
    changed = [
        {"id": key, "before": old[key], "after": new[key]}
        for key in sorted(old.keys() & new.keys())
        if old[key] != new[key]
    ]
    return {
        "same_pack": before.get("pack_hash") == after.get("pack_hash"),
        "added": [new[k] for k in sorted(new.keys() - old.keys())],
        "removed": [old[k] for k in sorted(old.keys() - new.keys())],
        "changed": changed,
        "unchanged": len(old.keys() & new.keys()) - len(changed),
    }


def diff_runs(session: Session, run_a: str, run_b: str) -> dict[str, Any] | None:
    """How the snapshots of two runs differ (agent definition and context pack); None if either
    run does not exist."""
    rows = {
        r.id: r
        for r in session.execute(
            select(AgentRun.id, AgentRun.agent_execution_snapshot, AgentRun.context_pack_snapshot)
            .where(AgentRun.id.in_([run_a, run_b]))
        )
    }
    if run_a not in rows or run_b not in rows:
        return None
    a, b = rows[run_a], rows[run_b]
    return {
        "runs": [run_a, run_b],
        "agent": diff_agent_snapshots(a.agent_execution_snapshot, b.agent_execution_snapshot),
        "context": diff_context_packs(a.context_pack_snapshot, b.context_pack_snapshot),
    }


def diff_agent_versions(
    session: Session, agent_id: str, version_a: int, version_b: int
) -> dict[str, Any] | None:
    """How two versions of one agent differ; None if either version does not exist."""
    rows = {
        r.version: version_dict(r)
        for r in session.execute(
            select(AgentVersion).where(
                AgentVersion.agent_id == agent_id, AgentVersion.version.in_([version_a, version_b])
            )
        ).scalars()
    }
    if version_a not in rows or version_b not in rows:
        return None
    return {
        "agent_id": agent_id,
        "versions": [version_a, version_b],
        **diff_agent_snapshots(rows[version_a], rows[version_b]),
    }
