"""Hand-built history for the query tests, written through the real write path (``ingest``).

Every step runs in its own write transaction stamped with a chosen moment (``ingest.history.
replay_at``), so the tests know every time, duration and outcome exactly. Nothing here inserts a
row by hand.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from agentledger.core.database import Database
from ingest.agents import AgentDefinition, add_agent_version, register_agent
from ingest.cancel import request_cancel
from ingest.events import append_events
from ingest.history import replay_at
from ingest.leases import claim_run, heartbeat
from ingest.reconcile import (
    interrupt_executor_runs,
    interrupt_if_lease_expired,
    interrupt_if_orphaned,
)
from ingest.runs import ContextItem, create_child_run, post_message, request_checksum
from ingest.sessions import create_session

# Scenarios start at 09:00 UTC thirty days ago: day buckets are known, and the history is in
# the past of the database clock, which the lease queries read.
T0 = (datetime.now(UTC) - timedelta(days=30)).replace(hour=9, minute=0, second=0, microsecond=0)
LEASE = 600.0
_keys = itertools.count(1)


def at_seconds(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@contextmanager
def write_at(db: Database, moment: datetime) -> Iterator:
    with db.write() as s:
        replay_at(s, moment)
        yield s


def agent(db: Database, agent_id: str, *, names: tuple[str, ...] = (), model: str = "m1",
          when: datetime = T0 - timedelta(days=30)) -> str:
    """Register an agent with one version per name (default: one version named after the id)."""
    names = names or (agent_id.title(),)
    with write_at(db, when) as s:
        register_agent(s, agent_id, AgentDefinition(name=names[0], kind="echo", model=model))
    for n, name in enumerate(names[1:], start=2):
        with write_at(db, when + timedelta(minutes=n)) as s:
            add_agent_version(s, agent_id, AgentDefinition(name=name, kind="echo", model=f"{model}-v{n}"))
    return agent_id


def new_version(db: Database, agent_id: str, name: str, *, model: str, when: datetime) -> None:
    with write_at(db, when) as s:
        add_agent_version(s, agent_id, AgentDefinition(name=name, kind="echo", model=model))


def chat(db: Database, *, owner: str, agent_id: str, title: str = "a chat",
         when: datetime = T0 - timedelta(days=1)) -> str:
    with write_at(db, when) as s:
        return create_session(s, owner_id=owner, agent_id=agent_id, title=title)


@dataclass(frozen=True)
class Run:
    run_id: str
    user_message_id: str
    answer_id: str | None = None


def ask(db: Database, session_id: str, content: str, *, owner: str, when: datetime,
        agent_id: str | None = None, context: list[ContextItem] | None = None):
    body = {"content": content, "n": next(_keys)}
    with write_at(db, when) as s:
        return post_message(
            s, owner_id=owner, session_id=session_id, idempotency_key=f"hist-{body['n']}",
            checksum=request_checksum(f"/api/sessions/{session_id}/messages", body),
            content=content, agent_id=agent_id, context=context,
        )


def start(db: Database, run_id: str, when: datetime, executor: str = "worker-1",
          lease_seconds: float = LEASE) -> None:
    with write_at(db, when) as s:
        claim_run(s, run_id, executor, lease_seconds=lease_seconds)


def events(db: Database, run_id: str, when: datetime, items: list[tuple[str, dict]],
           executor: str | None = "worker-1"):
    with write_at(db, when) as s:
        return append_events(s, run_id, items, executor_instance_id=executor)


def usage(db: Database, run_id: str, when: datetime, input_tokens: int, output_tokens: int,
          cost: float, executor: str = "worker-1") -> None:
    events(db, run_id, when, [("usage", {"input_tokens": input_tokens,
                                         "output_tokens": output_tokens, "cost_usd": cost})],
           executor)


def complete(db: Database, run_id: str, when: datetime, answer: str,
             executor: str = "worker-1") -> str:
    result = events(db, run_id, when, [("message.delta", {"text": answer}), ("run.completed", {})],
                    executor)
    return result.final_message_id


def fail(db: Database, run_id: str, when: datetime, executor: str = "worker-1") -> None:
    events(db, run_id, when, [("run.failed", {"error": {"code": "agent_error", "message": "boom"}})],
           executor)


def cancel(db: Database, run_id: str, when: datetime, *, confirm_at: datetime | None = None,
           executor: str = "worker-1") -> None:
    with write_at(db, when) as s:
        status = request_cancel(s, run_id, requested_by="tester")
    if status == "cancelling":
        events(db, run_id, confirm_at or when, [("run.cancelled", {"external_stop_confirmed": True})],
               executor)


def beat(db: Database, run_id: str, when: datetime, executor: str = "worker-1",
         lease_seconds: float = LEASE) -> None:
    with write_at(db, when) as s:
        heartbeat(s, run_id, executor, lease_seconds=lease_seconds)


def expire(db: Database, run_id: str, when: datetime) -> bool:
    """The reconciler's pass at ``when`` (after the lease ended)."""
    with write_at(db, when) as s:
        return interrupt_if_lease_expired(s, run_id)


def executor_gone(db: Database, executor: str, when: datetime, reason: str) -> list[str]:
    with write_at(db, when) as s:
        return interrupt_executor_runs(s, executor, reason=reason)


def orphan_check(db: Database, run_id: str, when: datetime) -> bool:
    with write_at(db, when) as s:
        return interrupt_if_orphaned(s, run_id)


def delegate(db: Database, parent_run_id: str, agent_id: str, when: datetime,
             executor: str = "worker-1") -> str:
    with write_at(db, when) as s:
        return create_child_run(s, parent_run_id, agent_id=agent_id, input="sub-task",
                                executor_instance_id=executor)


def answered(db: Database, session_id: str, content: str, answer: str, *, owner: str,
             when: datetime, queue_s: float = 1, run_s: float = 4, agent_id: str | None = None,
             context: list[ContextItem] | None = None, executor: str = "worker-1") -> Run:
    """A whole successful exchange: asked at ``when``, started ``queue_s`` later, answered after
    ``run_s`` more seconds."""
    posted = ask(db, session_id, content, owner=owner, when=when, agent_id=agent_id, context=context)
    started = when + timedelta(seconds=queue_s)
    start(db, posted.run_id, started, executor)
    answer_id = complete(db, posted.run_id, started + timedelta(seconds=run_s), answer, executor)
    return Run(posted.run_id, posted.message_id, answer_id)
