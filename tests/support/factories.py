"""Test data built through the real write path (``ingest``), never with raw INSERTs."""

from __future__ import annotations

import itertools

from agentledger.core.database import Database
from ingest.agents import AgentDefinition, add_agent_version, register_agent
from ingest.leases import claim_runs
from ingest.runs import ContextItem, PostedMessage, post_message, request_checksum
from ingest.sessions import create_session

_keys = itertools.count(1)


def make_agent(db: Database, agent_id: str = "echo", *, name: str | None = None,
               kind: str = "echo", params: dict | None = None, versions: int = 1) -> str:
    with db.write() as s:
        definition = AgentDefinition(name=name or agent_id.title(), kind=kind, params=params or {})
        register_agent(s, agent_id, definition)
        for n in range(2, versions + 1):
            add_agent_version(
                s, agent_id, AgentDefinition(name=f"{definition.name} v{n}", kind=kind,
                                             params=params or {})
            )
    return agent_id


def make_session(db: Database, *, owner: str = "alice", agent_id: str = "echo",
                 title: str | None = "a session") -> str:
    with db.write() as s:
        return create_session(s, owner_id=owner, agent_id=agent_id, title=title)


def post(db: Database, session_id: str, content: str = "hello", *, owner: str = "alice",
         key: str | None = None, agent_id: str | None = None,
         context: list[ContextItem] | None = None) -> PostedMessage:
    key = key or f"key-{next(_keys)}"
    body = {"content": content, **({"agent_id": agent_id} if agent_id else {})}
    with db.write() as s:
        return post_message(
            s, owner_id=owner, session_id=session_id, idempotency_key=key,
            checksum=request_checksum(f"/api/sessions/{session_id}/messages", body),
            content=content, agent_id=agent_id, context=context,
        )


def claim(db: Database, instance: str = "worker-1", *, max_runs: int = 10,
          lease_seconds: float = 30):
    with db.write() as s:
        return claim_runs(s, instance, max_runs=max_runs, lease_seconds=lease_seconds)


def answered_run(db: Database, question: str, events: list[tuple[str, dict]], *,
                 instance: str = "worker-1") -> str:
    """A run of a new session's ``question``, claimed by ``instance``, which appends ``events``
    (ending it); its id. The only queued run when called."""
    from ingest.events import append_events

    run_id = post(db, make_session(db), question).run_id
    [claimed] = claim(db, instance)
    assert claimed.run_id == run_id
    with db.write() as s:
        append_events(s, run_id, events, executor_instance_id=instance)
    return run_id
