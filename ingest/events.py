"""Appending events: the one guarded function that moves runs through the state machine.

Each call locks the run row (PostgreSQL ``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` already
holds the write lock), checks every event of the batch against ``state_machine.next_status``,
and only then writes: the events with gapless seqs and chained hashes, and one compare-and-set
``UPDATE agent_run … WHERE status = :current AND last_event_seq = :seq``. A refused batch writes
nothing. Terminal events also create the assistant message (``run.completed``), record the error
(``run.failed``) and tell a waiting parent (``run.child_finished``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import bindparam, func, insert, literal, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from agentledger.core import dialect
from agentledger.core.database import execute, read_one
from agentledger.core.errors import IllegalTransition, LeaseLost, NotFound
from agentledger.core.hashing import canonical_json, event_hash_of_json
from agentledger.core.ids import new_id
from agentledger.core.redaction import redactor_of
from agentledger.core.schema import AgentRun, Message, RunEvent
from agentledger.core.vocabulary import ACTIVE, TERMINAL
from ingest.event_types import validated_data
from ingest.rollup import RunOutcome, record_run_end, rollup_shard, run_usage
from ingest.state_machine import EVENT_TARGET, Lease, next_status, row_changes

LOCKED_RUN_COLUMNS = (
    AgentRun.id,
    AgentRun.status,
    AgentRun.last_event_seq,
    AgentRun.last_event_hash,
    AgentRun.parent_run_id,
    AgentRun.session_id,
    AgentRun.thread_id,
    AgentRun.owner_id,
    AgentRun.executor_instance_id,
    AgentRun.lease_expires_at,
    AgentRun.agent_id,
    AgentRun.agent_version,
    AgentRun.created_at,
    AgentRun.started_at,
)


@dataclass(frozen=True)
class AppendResult:
    run_id: str
    seqs: list[int]
    status: str
    cancel_requested: bool
    final_message_id: str | None = None


@dataclass
class _Pending:
    type: str
    data: dict
    extra: dict[str, Any] = field(default_factory=dict)


def lock_run(session: Session, run_id: str):
    """The run's row, locked until the transaction ends."""
    row = read_one(session, _lock_statement(session), {"run_id": run_id})
    if row is None:
        raise NotFound(f"run {run_id} does not exist")
    return row


_LOCK_STATEMENTS: dict[str, Any] = {}


def _lock_statement(session: Session):
    # Built once per dialect: every append, cancel and delegation starts with this statement.
    key = dialect.name(session)
    if key not in _LOCK_STATEMENTS:
        # The row lock and the clock in one round trip (dialect.locked_with_clock).
        stmt = dialect.locked_with_clock(
            select(*LOCKED_RUN_COLUMNS).where(AgentRun.id == bindparam("run_id")), key)
        _LOCK_STATEMENTS[key] = stmt
    return _LOCK_STATEMENTS[key]


# The compare-and-set that moves a run's head; the columns it sets are the execute
# parameters that are not the three conditions (SQLAlchemy builds the SET clause from them).
_ADVANCE_RUN = update(AgentRun.__table__).where(
    AgentRun.__table__.c.id == bindparam("run_id_"),
    AgentRun.__table__.c.status == bindparam("status_"),
    AgentRun.__table__.c.last_event_seq == bindparam("last_event_seq_"),
)
# On PostgreSQL it also sends the stream's NOTIFY (delivered at commit), one round trip fewer.
_ADVANCE_RUN_NOTIFYING = _ADVANCE_RUN.returning(
    func.pg_notify(literal(dialect.EVENTS_CHANNEL), AgentRun.__table__.c.id))

# One event and the head it moves in one statement on PostgreSQL (the INSERT as a
# data-modifying CTE of the compare-and-set): a single-event append, the commonest, costs one
# round trip fewer. The event's parameters are the ``event_*`` names.
_APPENDED_EVENT = insert(RunEvent.__table__).values(
    run_id=bindparam("event_run_id"), seq=bindparam("event_seq"), type=bindparam("event_type"),
    data=bindparam("event_data"), created_at=bindparam("event_created_at"),
    hash=bindparam("event_hash"),
).cte("appended_event")
_ADVANCE_RUN_WITH_EVENT = _ADVANCE_RUN_NOTIFYING.add_cte(_APPENDED_EVENT)
_APPENDED_EVENT_PARAMS = ("event_run_id", "event_seq", "event_type", "event_data",
                          "event_created_at", "event_hash")

# Events whose data the ledger itself makes of ids, times and its own words: redacting them
# (a custom pattern that matches digits) could only break the links they record.
NOT_REDACTED = frozenset({"run.queued", "run.started", "run.child_created", "run.child_finished",
                           "run.cancelling"})

_ENDING = frozenset(e for e, to in EVENT_TARGET.items() if to in TERMINAL)


_PARENT_OF = select(AgentRun.parent_run_id).where(AgentRun.id == bindparam("run_id"))


def lock_run_and_parent(session: Session, run_id: str):
    """Lock the parent (whose ``run.child_finished`` an ending child appends), then the run.

    Every writer locks ancestors before descendants, so two transactions never wait on each
    other in opposite orders.
    """
    parent = execute(session, _PARENT_OF, {"run_id": run_id}).scalar_one_or_none()
    if parent:
        lock_run(session, parent)
    return lock_run(session, run_id)


_EVENT_COLUMNS = ("run_id", "seq", "type", "data", "created_at", "hash")
_INSERT_EVENT = insert(RunEvent.__table__)
_INSERT_MESSAGE = insert(Message.__table__)


def _insert_events(session: Session, rows: list[tuple]) -> None:
    """Rows are (run_id, seq, type, data JSON text, created_at, hash, data)."""
    if len(rows) > 1 and dialect.name(session) == "postgresql":
        # A batch goes in with COPY, reusing the JSON text the hash was computed over: an
        # executemany of 100 INSERTs spends more time in the driver than in the database.
        dialect.copy_rows(session, "run_event", _EVENT_COLUMNS, (r[:6] for r in rows))
        return
    execute(session, _INSERT_EVENT, [
        {"run_id": r[0], "seq": r[1], "type": r[2], "data": r[6], "created_at": r[4],
         "hash": r[5]} for r in rows
    ])


_DELTAS_OF = (select(RunEvent.data)
              .where(RunEvent.run_id == bindparam("run_id"), RunEvent.type == "message.delta")
              .order_by(RunEvent.seq))


def _delta_text(session: Session, run_id: str) -> str:
    rows = execute(session, _DELTAS_OF, {"run_id": run_id}).scalars()
    return "".join(str(d.get("text", "")) for d in rows)


def append_events(
    session: Session,
    run_id: str,
    events: list[tuple[str, dict]],
    *,
    executor_instance_id: str | None = None,
    lease: Lease | None = None,
    now: datetime | None = None,
    locked=None,
) -> AppendResult:
    """Append ``events`` (type, data) to a run in order, atomically.

    With ``executor_instance_id`` the caller must hold a live lease on the run (else
    ``LeaseLost``: expired, another instance's, or the run ended). ``lease`` is the lease a
    ``run.started`` in the batch grants (the claim passes it). ``locked``: the run's row as
    the caller read it under its row lock in this transaction, with ``LOCKED_RUN_COLUMNS``
    (the claim's); not for a batch that ends the run, whose parent must be locked first.
    """
    if not events:
        raise ValueError("append_events needs at least one event")
    ends_run = any(t in _ENDING for t, _ in events)
    if locked is not None:
        if ends_run:
            raise ValueError("a batch that ends the run locks its parent first: no locked row")
        run = locked
    elif ends_run:
        run = lock_run_and_parent(session, run_id)
    else:
        run = lock_run(session, run_id)
    # After the lock: events of one run are stamped in the order their appends committed.
    now = now or dialect.now(session, read=run.now)
    if executor_instance_id is not None:
        check_lease(run, executor_instance_id, now)

    status = run.status
    pending: list[_Pending] = []
    for event_type, data in events:
        data = validated_data(event_type, data)
        if status in TERMINAL and run.status not in TERMINAL:
            # The run ends earlier in this very batch: the batch itself is malformed.
            raise IllegalTransition(f"{event_type} cannot follow the run's terminal event")
        status = next_status(status, event_type)
        pending.append(_Pending(event_type, dict(data)))
    redactor = redactor_of(session)
    if redactor.active:  # before anything below stores or hashes the data
        for item in pending:
            if item.type not in NOT_REDACTED:
                item.data = redactor.value(item.data)

    values: dict[str, Any] = {}
    final_message_id = None
    delta_text_in_batch = "".join(
        str(p.data.get("text", "")) for p in pending if p.type == "message.delta"
    )
    for item in pending:
        if item.type == "run.completed":
            content = item.data.pop("content", None)
            if content is None:
                content = _delta_text(session, run_id) + delta_text_in_batch
            # Joined deltas may form a value no single delta held.
            content = redactor.text(content)
            final_message_id = new_id("msg")
            session.execute(_INSERT_MESSAGE, {
                "id": final_message_id, "session_id": run.session_id,
                "thread_id": run.thread_id, "owner_id": run.owner_id, "role": "assistant",
                "content": content, "run_id": run_id, "created_at": now})
            item.data["final_message_id"] = final_message_id
        values.update(row_changes(item.type, item.data, now, lease=lease))

    seq = run.last_event_seq
    chain = run.last_event_hash
    rows = []
    for item in pending:
        seq += 1
        data_json = canonical_json(item.data)
        chain = event_hash_of_json(chain, run_id, seq, item.type, data_json, now)
        rows.append((run_id, seq, item.type, data_json, now, chain, item.data))
    postgres = dialect.name(session) == "postgresql"
    # On PostgreSQL a single event goes in with the head advance (one statement).
    with_advance = postgres and len(rows) == 1
    if with_advance:
        values.update(zip(_APPENDED_EVENT_PARAMS, (run_id, seq, rows[0][2], rows[0][6], now,
                                                   chain), strict=True))
    else:
        _insert_events(session, rows)
    usage = None
    if status in TERMINAL:
        # The run's usage totals are final with its terminal event (always its last); they go
        # on its row with the ending, and into the rollup below. Every usage event is stored
        # by now: a batch still to go in with the head advance is the terminal event alone.
        usage = run_usage(session, run_id)
        values.update(zip(("usage_input_tokens", "usage_output_tokens", "usage_cost_usd"), usage,
                          strict=True))

    values.update(status=status, last_event_seq=seq, last_event_hash=chain)
    advance = (_ADVANCE_RUN_WITH_EVENT if with_advance
               else _ADVANCE_RUN_NOTIFYING if postgres else _ADVANCE_RUN)
    updated = execute(session, advance, {
        "run_id_": run_id, "status_": run.status, "last_event_seq_": run.last_event_seq,
        **values,
    })
    if cast(CursorResult, updated).rowcount != 1:  # pragma: no cover - the row lock makes this unreachable
        raise RuntimeError(f"run {run_id} changed under its lock")
    if postgres:
        updated.close()
        dialect.notified(session, dialect.EVENTS_CHANNEL, run_id)
    else:
        dialect.notify(session, dialect.EVENTS_CHANNEL, run_id)
    if redactor.count:
        session.execute(update(AgentRun).where(AgentRun.id == run_id).values(
            redaction_count=AgentRun.redaction_count + redactor.count))

    if usage is not None:
        # The outcome rollup moves in the same transaction as the run's ending (ingest.rollup).
        tokens_in, tokens_out, cost = usage
        record_run_end(session, RunOutcome(
            agent_id=run.agent_id, agent_version=run.agent_version, status=status,
            created_at=run.created_at, started_at=values.get("started_at", run.started_at),
            finished_at=now, input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost,
        ), shard=rollup_shard(run_id))
    if status in TERMINAL and run.parent_run_id:
        _tell_parent(session, run.parent_run_id, run_id, status, now)
    return AppendResult(
        run_id=run_id,
        seqs=[r[1] for r in rows],
        status=status,
        cancel_requested=status == "cancelling",
        final_message_id=final_message_id,
    )


def check_lease(run, executor_instance_id: str, now: datetime) -> None:
    if run.status in TERMINAL:
        raise LeaseLost(f"run {run.id} has ended ({run.status}); its lease is gone")
    if (
        run.status not in ACTIVE
        or run.executor_instance_id != executor_instance_id
        or run.lease_expires_at is None
        or run.lease_expires_at <= now
    ):
        raise LeaseLost(f"executor {executor_instance_id} does not hold the lease of run {run.id}")


def _tell_parent(session: Session, parent_id: str, child_id: str, status: str, now: datetime) -> None:
    parent_status = session.execute(
        select(AgentRun.status).where(AgentRun.id == parent_id)
    ).scalar_one()
    if parent_status in ACTIVE:
        append_events(
            session,
            parent_id,
            [("run.child_finished", {"child_run_id": child_id, "status": status})],
            now=now,
        )


def lease_deadline(now: datetime, lease_seconds: float) -> datetime:
    return now + timedelta(seconds=lease_seconds)

