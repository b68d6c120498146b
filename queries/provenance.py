"""Which run, agent, agent version and context produced this answer, and the reverse: which
answers did a given agent version or context item produce? How do two snapshots differ?

Read from the producing runs' frozen snapshots, never from today's agent or session settings.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core.schema import AgentRun, AgentVersion, ChatSession, Message
from queries.agents_catalog import version_dict
from queries.common import DEFAULT_LIMIT, Page, iso, run_summary, run_visible_to
from queries.message_search import MessageSearch, search_messages
from queries.sessions import session_dict
from queries.thread_history import thread_history


class UserMessage(Exception):
    """Provenance was asked of a user message."""


def message_provenance(
    session: Session, message_id: str, *, visible_to: str | None = None
) -> dict[str, Any] | None:
    """The auditor's answer in one call; None if the message is not visible.

    Raises ``UserMessage`` for a user's own message (only answers have a producer).
    """
    stmt = (
        select(Message, AgentRun)
        .join(AgentRun, AgentRun.id == Message.run_id)
        .where(Message.id == message_id)
    )
    if visible_to is not None:
        stmt = stmt.where(run_visible_to(visible_to))
    found = session.execute(stmt).one_or_none()
    if found is None:
        return None
    message, run = found
    if message.role != "assistant":
        raise UserMessage(message_id)
    chat = None
    if message.session_id is not None:
        chat = session.execute(
            select(ChatSession).where(ChatSession.id == message.session_id)
        ).scalar_one_or_none()
    snapshot = run.agent_execution_snapshot
    return {
        "message": {
            "id": message.id,
            "role": message.role,
            "content": message.content,
            "created_at": iso(message.created_at),
            "session_id": message.session_id,
            "run_id": message.run_id,
        },
        "run": run_summary(run),
        "agent": {"id": snapshot["agent_id"], "name": snapshot["name"], "version": snapshot["version"]},
        "agent_execution_snapshot": snapshot,
        "context_pack_snapshot": run.context_pack_snapshot,
        "session": session_dict(chat) if chat is not None else None,
        # What the producing run had in memory: its thread's earlier turns, with message ids.
        "history": thread_history(session, run.id),
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
