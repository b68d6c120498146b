"""Read-side helpers for the ingest tests: what is stored, read straight from the tables."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from agentledger.core.database import Database, normalize_url
from agentledger.core.schema import AgentRun, ChatSession, ContextBlob, Message, RunEvent
from queries.chain_verification import verify_chains

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

# CONTRACT §2/§3, written out independently of ingest.state_machine.
TERMINAL_STATUSES = ("succeeded", "failed", "cancelled", "interrupted")
TERMINAL_EVENTS = ("run.completed", "run.failed", "run.cancelled", "run.interrupted")
STATUS_AFTER_EVENT = {
    "run.queued": "queued",
    "run.started": "running",
    "run.cancelling": "cancelling",
    "run.completed": "succeeded",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "run.interrupted": "interrupted",
}


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    type: str
    data: dict


def events(db: Database, run_id: str) -> list[StoredEvent]:
    with db.read() as s:
        rows = s.execute(
            select(RunEvent.seq, RunEvent.type, RunEvent.data)
            .where(RunEvent.run_id == run_id)
            .order_by(RunEvent.seq)
        ).all()
    return [StoredEvent(r.seq, r.type, r.data) for r in rows]


def event_types(db: Database, run_id: str) -> list[str]:
    return [e.type for e in events(db, run_id)]


def run_row(db: Database, run_id: str):
    with db.read() as s:
        return s.execute(select(AgentRun.__table__).where(AgentRun.id == run_id)).one()


def message_row(db: Database, message_id: str):
    with db.read() as s:
        return s.execute(select(Message.__table__).where(Message.id == message_id)).one()


def session_row(db: Database, session_id: str):
    with db.read() as s:
        return s.execute(
            select(ChatSession.__table__).where(ChatSession.id == session_id)
        ).one()


def counts(db: Database) -> dict[str, int]:
    """Row counts of the tables a write may touch: equal before and after means nothing written."""
    with db.read() as s:
        return {
            model.__tablename__: s.execute(select(func.count()).select_from(model)).scalar_one()
            for model in (AgentRun, Message, RunEvent, ContextBlob)
        }


def snapshot_state(db: Database) -> tuple:
    """Counts plus every run's (status, last_event_seq, lease): detects any write at all."""
    with db.read() as s:
        runs = s.execute(
            select(
                AgentRun.id, AgentRun.status, AgentRun.last_event_seq, AgentRun.last_event_hash,
                AgentRun.lease_expires_at, AgentRun.executor_instance_id,
                AgentRun.final_message_id, AgentRun.error,
            ).order_by(AgentRun.id)
        ).all()
    return counts(db), [tuple(r) for r in runs]


def assert_chains_ok(db: Database, run_id: str | None = None) -> None:
    with db.read(transaction=run_id is None) as s:
        report = verify_chains(s, run_id=run_id)
    assert report.ok, report.problems


def assert_run_invariants(db: Database, run_id: str) -> list[StoredEvent]:
    """The per-run promises of CONTRACT §2/§3, checked on what is stored."""
    evs = events(db, run_id)
    run = run_row(db, run_id)
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1)), "seqs must be 1..n, no gaps"
    assert run.last_event_seq == len(evs)
    assert evs[0].type == "run.queued"
    terminal = [i for i, e in enumerate(evs) if e.type in TERMINAL_EVENTS]
    assert len(terminal) <= 1, f"more than one terminal event: {[e.type for e in evs]}"
    if terminal:
        assert terminal[0] == len(evs) - 1, "the terminal event must be the last"
    changing = [e.type for e in evs if e.type in STATUS_AFTER_EVENT]
    assert run.status == STATUS_AFTER_EVENT[changing[-1]]
    if "run.cancelling" in changing:
        after = changing[changing.index("run.cancelling"):]
        assert "run.completed" not in after and "run.failed" not in after
    if run.status in TERMINAL_STATUSES:
        assert run.finished_at is not None
    return evs


@contextmanager
def fresh_database(kind: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a new, empty (unmigrated) database of ``kind``, dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    admin_url = normalize_url(os.environ.get("AGENTLEDGER_TEST_PG_URL", DEFAULT_PG_URL))
    libpq = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"agentledger_fresh_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(libpq, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
