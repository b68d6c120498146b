"""Appending events: the one guarded function that moves runs through the state machine.

Each call locks the run row (PostgreSQL ``FOR NO KEY UPDATE``; SQLite's ``BEGIN IMMEDIATE`` already
holds the write lock), checks every event of the batch against ``state_machine.next_status``,
and only then writes: the events with gapless seqs and chained hashes, and one compare-and-set
``UPDATE agent_run … WHERE status = :current AND last_event_seq = :seq``. A refused batch writes
nothing. Terminal events also create the assistant message (``run.completed``), record the error
(``run.failed``) and tell a waiting parent (``run.child_finished``).

An executor's append that is a transaction of its own (``append_events_alone``) is, on
PostgreSQL and for most batches, that compare-and-set alone: the head is read unlocked and a
lost race starts the append again from the new head.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Integer,
    Text,
    bindparam,
    exists,
    func,
    insert,
    literal,
    select,
    type_coerce,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Session, aliased

from agentledger.core import dialect
from agentledger.core.database import (
    AutocommitWrites,
    Database,
    execute,
    execute_write,
    read_all,
    read_one,
)
from agentledger.core.driver_statements import one_of
from agentledger.core.errors import IdempotencyConflict, IllegalTransition, LeaseLost, NotFound
from agentledger.core.hashing import (
    answer_sha256,
    canonical_json,
    chained_hashes,
    event_hash_of_json,
)
from agentledger.core.ids import new_id
from agentledger.core.outcome_sums import usage_totals
from agentledger.core.redaction import redactor_of
from agentledger.core.schema import AgentRun, Message, RunEvent, UTCDateTime
from agentledger.core.vocabulary import ACTIVE, TERMINAL
from ingest.event_types import validated_data
from ingest.rollup import RunOutcome, record_run_end, rollup_shard
from ingest.state_machine import (
    EVENT_TARGET,
    Lease,
    check_executor_interrupt,
    next_status,
    row_changes,
)

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
    AgentRun.last_append_key_hash,
    AgentRun.last_append_checksum,
    AgentRun.last_append_first_seq,
)


@dataclass(frozen=True)
class AppendResult:
    run_id: str
    seqs: list[int]
    status: str
    cancel_requested: bool
    final_message_id: str | None = None


@dataclass(frozen=True)
class AppendKey:
    """An executor append's ``Idempotency-Key`` (as ``ingest.runs.idempotency_key_hash``)
    and its request's checksum. A run remembers its latest keyed append: the same append sent
    again (its answer was lost on the way) is answered with the seqs it wrote, not written twice;
    the same key with another request is ``IdempotencyConflict``. Only the latest is kept: an
    executor appends to a run one batch at a time and sends the next only once the last is
    settled."""

    key_hash: str
    checksum: str

    def columns(self, first_seq: int) -> dict[str, Any]:
        """What the append that writes under this key sets on its run's row."""
        return {"last_append_key_hash": self.key_hash, "last_append_checksum": self.checksum,
                "last_append_first_seq": first_seq}


def replayed_append(run, key: AppendKey | None, count: int) -> AppendResult | None:
    """The answer to an append of ``count`` events that ``run`` (its row, with
    ``LOCKED_RUN_COLUMNS``) already took under ``key``, or None to write it. Checked before the
    lease: an append that ended the run is answered after the run has ended."""
    if key is None or run.last_append_key_hash != key.key_hash:
        return None
    if run.last_append_checksum != key.checksum:
        # A delegation is an append to its parent (its run.child_created) under the same key.
        raise IdempotencyConflict("this Idempotency-Key was already used for a different "
                                  "request to this run (an append or a delegation); use a new "
                                  "key")
    first = run.last_append_first_seq
    return AppendResult(run_id=run.id, seqs=list(range(first, first + count)), status=run.status,
                        cancel_requested=run.status == "cancelling")


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


_LOCK_STATEMENTS: dict[tuple[str, bool], Any] = {}


def _lock_statement(session: Session, *, root_only: bool = False):
    # Built once per dialect: every append, cancel and delegation starts with this statement.
    key = (dialect.name(session), root_only)
    if key not in _LOCK_STATEMENTS:
        # The row lock and the clock in one round trip (dialect.locked_with_clock).
        query = select(*LOCKED_RUN_COLUMNS).where(AgentRun.id == bindparam("run_id"))
        if root_only:
            query = query.where(AgentRun.parent_run_id.is_(None))
        _LOCK_STATEMENTS[key] = dialect.locked_with_clock(query, key[0])
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

# Whether a run that ends has a queued run behind it on its thread, which its end makes
# claimable: then the claim loops are told (the queue's NOTIFY) instead of finding it on their
# next turn, up to a second later. The thread's runs start in (created_at, id) order, so its
# queued runs were all created at or after the running one: the probe of the thread's
# (thread_id, created_at) index starts at the ending run, not at the thread's first run.
_QUEUED_RUN = aliased(AgentRun, name="queued_run")
_QUEUED_BEHIND = exists(
    select(_QUEUED_RUN.id).where(_QUEUED_RUN.thread_id == AgentRun.thread_id,
                                 _QUEUED_RUN.created_at >= AgentRun.created_at,
                                 _QUEUED_RUN.status == "queued")
).label("queued_behind")
_QUEUED_BEHIND_OF_RUN = select(_QUEUED_BEHIND).where(AgentRun.id == bindparam("run_id"))

# One event and the head it moves in one statement on PostgreSQL (the INSERT as a
# data-modifying CTE of the compare-and-set): a single-event append, the commonest, costs one
# round trip fewer. The event's parameters are the ``event_*`` names.
_APPENDED_EVENT = insert(RunEvent.__table__).values(
    run_id=bindparam("event_run_id"), seq=bindparam("event_seq"), type=bindparam("event_type"),
    data=bindparam("event_data"), created_at=bindparam("event_created_at"),
    hash=bindparam("event_hash"),
).cte("appended_event")
_APPENDED_EVENT_PARAMS = ("event_run_id", "event_seq", "event_type", "event_data",
                          "event_created_at", "event_hash")


def _unnested(name: str, **columns: tuple[str, Any]):
    """Rows the server makes of parallel array parameters: ``column=(parameter, element
    type)``; a batch of rows costs one parameter per column, not one per value."""
    return (func.unnest(*(bindparam(p, type_=ARRAY(t)) for p, t in columns.values()))
            .table_valued(*columns).render_derived(name=name))


_EVENT_COLUMNS = ("run_id", "seq", "type", "data", "created_at", "hash")
# A few events as arrays (``events_*``; the data as its canonical JSON text, which the hash was
# computed over), unnested into rows by the server.
_NEW_EVENTS = _unnested("new_events", seq=("events_seq", Integer), type=("events_type", Text),
                        data=("events_data", Text), hash=("events_hash", Text))
_NEW_EVENT_ROWS = select(
    bindparam("events_run_id", type_=RunEvent.__table__.c.run_id.type), _NEW_EVENTS.c.seq,
    _NEW_EVENTS.c.type, sql_cast(_NEW_EVENTS.c.data, JSONB),
    bindparam("events_created_at", type_=RunEvent.__table__.c.created_at.type),
    _NEW_EVENTS.c.hash)
_APPENDED_EVENTS = insert(RunEvent.__table__).from_select(
    list(_EVENT_COLUMNS), _NEW_EVENT_ROWS,
).cte("appended_events")
# The ending's assistant message (``msg_*``: not names of agent_run columns, which would be
# taken for columns to set).
_APPENDED_MESSAGE = insert(Message.__table__).values(
    id=bindparam("msg_id"), session_id=bindparam("msg_session_id"),
    thread_id=bindparam("msg_thread_id"), owner_id=bindparam("msg_owner_id"),
    role=bindparam("msg_role"), content=bindparam("msg_content"), run_id=bindparam("msg_run_id"),
    created_at=bindparam("msg_created_at"),
).cte("appended_message")
# How a batch's events go in on PostgreSQL: none with the advance (COPY before it), one as
# ``event_*`` parameters, or a few as arrays.
_EVENTS_NONE, _EVENTS_ONE, _EVENTS_MANY = "none", "one", "many"
_EVENTS_IN_ADVANCE_MAX = 32


@functools.cache
def _advance_statement(events_in: str, with_message: bool, ending: bool):
    """The PostgreSQL head advance with what goes in with it; built once per shape. An
    ending's also answers whether a queued run waits behind it (``_QUEUED_BEHIND``)."""
    stmt = _ADVANCE_RUN_NOTIFYING
    if ending:
        stmt = stmt.returning(_QUEUED_BEHIND)
    if events_in == _EVENTS_ONE:
        stmt = stmt.add_cte(_APPENDED_EVENT)
    elif events_in == _EVENTS_MANY:
        stmt = stmt.add_cte(_APPENDED_EVENTS)
    if with_message:
        stmt = stmt.add_cte(_APPENDED_MESSAGE)
    return stmt

# The claim's ``run.started`` of several locked runs in one statement on PostgreSQL
# (``start_locked_runs``): per run its id, the seq it holds and the new event's seq and hash, as
# arrays the server unnests; the event data (the lease granted to every run of the claim) and
# the columns the start sets are shared parameters.
_STARTS = _unnested("starts", run_id=("start_run_ids", Text),
                    prev_seq=("start_prev_seqs", Integer), seq=("start_seqs", Integer),
                    hash=("start_hashes", Text))
_STARTED_EVENTS = insert(RunEvent.__table__).from_select(
    ["run_id", "seq", "type", "data", "created_at", "hash"],
    select(_STARTS.c.run_id, _STARTS.c.seq, literal("run.started"),
           sql_cast(bindparam("start_data", type_=Text), JSONB),
           bindparam("start_at", type_=RunEvent.__table__.c.created_at.type), _STARTS.c.hash),
).cte("started_events")


@functools.cache
def _start_statement(changed: tuple[str, ...]):
    """The compare-and-set of many runs' heads from ``queued``, the events inserted with it
    (a data-modifying CTE) and each run's stream ``NOTIFY``; built once per set of changed
    columns (``changed``: what ``row_changes`` sets for a start)."""
    t = AgentRun.__table__
    return (update(t)
            .where(t.c.id == _STARTS.c.run_id, t.c.status == "queued",
                   t.c.last_event_seq == _STARTS.c.prev_seq)
            .values(status="running", last_event_seq=_STARTS.c.seq,
                    last_event_hash=_STARTS.c.hash,
                    **{c: bindparam(f"start_set_{c}", type_=t.c[c].type) for c in changed})
            .returning(func.pg_notify(literal(dialect.EVENTS_CHANNEL), t.c.id))
            .add_cte(_STARTED_EVENTS))


def start_locked_runs(session: Session, rows: Sequence, lease: Lease, now: datetime) -> None:
    """Append ``run.started`` (granting ``lease``) to each of ``rows``: queued runs the caller
    locked in this transaction, with ``LOCKED_RUN_COLUMNS`` (the claim's). The same checks
    and hash chain as ``append_events``, with the events and the heads of all the runs in one
    statement on PostgreSQL: a claim of ten runs costs one round trip, not ten. Elsewhere, one
    ``append_events`` per run."""
    assert lease.expires_at is not None, "a claim's lease has an end"
    data = validated_data("run.started", {
        "executor_instance_id": lease.executor_instance_id,
        "lease_expires_at": lease.expires_at.isoformat(),
    })
    if dialect.name(session) != "postgresql" or len(rows) == 1:
        for row in rows:
            append_events(session, row.id, [("run.started", data)], lease=lease, now=now,
                          locked=row)
        return
    data_json = canonical_json(data)
    seqs, hashes = [], []
    for row in rows:
        next_status(row.status, "run.started")  # raises unless queued, as in append_events
        seqs.append(row.last_event_seq + 1)
        hashes.append(event_hash_of_json(row.last_event_hash, row.id, seqs[-1], "run.started",
                                         data_json, now))
    changes = row_changes("run.started", data, now, lease=lease)
    started = execute_write(session, _start_statement(tuple(sorted(changes))), {
        "start_run_ids": [row.id for row in rows],
        "start_prev_seqs": [row.last_event_seq for row in rows],
        "start_seqs": seqs, "start_hashes": hashes, "start_data": data_json, "start_at": now,
        **{f"start_set_{c}": v for c, v in changes.items()},
    })
    if len(started.all()) != len(rows):  # pragma: no cover - the row locks make this unreachable
        raise RuntimeError("a claimed run changed under its lock")
    for row in rows:
        dialect.notified(session, dialect.EVENTS_CHANNEL, row.id)


# Events whose data the ledger itself makes of ids, times and its own words: redacting them
# (a custom pattern that matches digits) could only break the links they record.
NOT_REDACTED = frozenset({"run.queued", "run.started", "run.child_created", "run.child_finished",
                           "run.cancelling"})

_ENDING = frozenset(e for e, to in EVENT_TARGET.items() if to in TERMINAL)


_PARENT_OF = select(AgentRun.parent_run_id).where(AgentRun.id == bindparam("run_id"))


def lock_run_and_parent(session: Session, run_id: str):
    """Lock the parent (whose ``run.child_finished`` an ending child appends), then the run.

    Every writer locks ancestors before descendants, so two transactions never wait on each
    other in opposite orders. A root run (most runs) has no parent to lock first: one statement
    locks it if it is one (``parent_run_id`` never changes), else the parent is looked up.
    """
    root = read_one(session, _lock_statement(session, root_only=True), {"run_id": run_id})
    if root is not None:
        return root
    parent = execute(session, _PARENT_OF, {"run_id": run_id}).scalar_one_or_none()
    if parent:
        lock_run(session, parent)
    return lock_run(session, run_id)


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


# What a run's ending needs of its stored events, in one read: the usage events (its totals)
# and, when the answer is the joined deltas, the message.delta events; in seq order.
_ENDING_READS = {
    with_deltas: (select(RunEvent.type, RunEvent.data)
                  .where(RunEvent.run_id == bindparam("run_id"),
                         one_of(RunEvent.type, ("usage", "message.delta") if with_deltas
                                else ("usage",)))
                  .order_by(RunEvent.seq))
    for with_deltas in (False, True)
}


@dataclass
class _Stored:
    """The run's stored usage data and delta text, read under its lock before the batch."""

    usage: list[dict] = field(default_factory=list)
    delta_text: str = ""


def _stored_for_ending(session: Session, run_id: str, with_deltas: bool) -> _Stored:
    found = _Stored()
    deltas = []
    for event_type, data in read_all(session, _ENDING_READS[with_deltas], {"run_id": run_id}):
        if event_type == "usage":
            found.usage.append(data)
        else:
            deltas.append(str(data.get("text", "")))
    found.delta_text = "".join(deltas)
    return found


def append_events(
    session: Session,
    run_id: str,
    events: list[tuple[str, dict]],
    *,
    executor_instance_id: str | None = None,
    lease: Lease | None = None,
    now: datetime | None = None,
    locked=None,
    key: AppendKey | None = None,
) -> AppendResult:
    """Append ``events`` (type, data) to a run in order, atomically.

    With ``executor_instance_id`` the caller must hold a live lease on the run (else
    ``LeaseLost``: expired, another instance's, or the run ended). ``lease`` is the lease a
    ``run.started`` in the batch grants (the claim passes it). ``locked``: the run's row as
    the caller read it under its row lock in this transaction, with ``LOCKED_RUN_COLUMNS``
    (the claim's); not for a batch that ends the run, whose parent must be locked first.
    ``key``: the executor's ``Idempotency-Key`` for this append (``AppendKey``).
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
    if (replay := replayed_append(run, key, len(events))) is not None:
        return replay
    # After the lock: events of one run are stamped in the order their appends committed.
    now = now or dialect.now(session, read=run.now)
    if executor_instance_id is not None:
        check_lease(run, executor_instance_id, now)
        for event_type, data in events:
            if event_type == "run.interrupted":
                check_executor_interrupt(run.status, data)

    status, pending = _checked(run.status, events)
    redactor = redactor_of(session)
    if redactor.active:  # before anything below stores or hashes the data
        for item in pending:
            if item.type not in NOT_REDACTED:
                item.data = redactor.value(item.data)

    postgres = dialect.name(session) == "postgresql"
    values: dict[str, Any] = {}
    final_message_id = None
    message: dict[str, Any] | None = None
    stored = None
    if status in TERMINAL:
        # Under the lock, before the batch goes in: what the ending sums and joins.
        stored = _stored_for_ending(session, run_id, with_deltas=any(
            p.type == "run.completed" and p.data.get("content") is None for p in pending))
    for item in pending:
        if item.type == "run.completed":
            content = item.data.pop("content", None)
            if content is None:
                assert stored is not None
                content = stored.delta_text + "".join(
                    str(p.data.get("text", "")) for p in pending if p.type == "message.delta")
            # Joined deltas may form a value no single delta held.
            content = redactor.text(content)
            final_message_id = new_id("msg")
            message = {"id": final_message_id, "session_id": run.session_id,
                       "thread_id": run.thread_id, "owner_id": run.owner_id,
                       "role": "assistant", "content": content, "run_id": run_id,
                       "created_at": now}
            item.data["final_message_id"] = final_message_id
            item.data["content_sha256"] = answer_sha256(content)
        values.update(row_changes(item.type, item.data, now, lease=lease))

    rows = _chained(run_id, run, pending, now)
    seq, chain = rows[-1][1], rows[-1][5]
    # On PostgreSQL a batch of a few events and the ending's message go in with the head
    # advance, in one statement (data-modifying CTEs of it); a long batch goes in with COPY.
    events_in = (_EVENTS_NONE if not postgres or len(rows) > _EVENTS_IN_ADVANCE_MAX
                 else _EVENTS_ONE if len(rows) == 1 else _EVENTS_MANY)
    if events_in == _EVENTS_NONE:
        _insert_events(session, rows)
    else:
        values.update(_events_in_advance(rows, now))
    with_message = postgres and message is not None
    if with_message:
        assert message is not None
        values.update({f"msg_{k}": v for k, v in message.items()})
    elif message is not None:
        session.execute(_INSERT_MESSAGE, message)
    usage = None
    if stored is not None:
        # The run's usage totals are final with its terminal event (always its last); they go
        # on its row with the ending, and into the rollup below: the stored usage events and
        # the batch's, in seq order.
        usage = usage_totals([*stored.usage, *(p.data for p in pending if p.type == "usage")])
        values.update(zip(("usage_input_tokens", "usage_output_tokens", "usage_cost_usd"), usage,
                          strict=True))

    values.update(status=status, last_event_seq=seq, last_event_hash=chain)
    if key is not None:
        values.update(key.columns(rows[0][1]))
    advance = (_advance_statement(events_in, with_message, ends_run) if postgres
               else _ADVANCE_RUN)
    updated = execute_write(session, advance, {
        "run_id_": run_id, "status_": run.status, "last_event_seq_": run.last_event_seq,
        **values,
    })
    if updated.rowcount != 1:  # pragma: no cover - the row lock makes this unreachable
        raise RuntimeError(f"run {run_id} changed under its lock")
    queued_behind = False
    if postgres:
        if ends_run:
            queued_behind = updated.one().queued_behind
        updated.close()
        dialect.notified(session, dialect.EVENTS_CHANNEL, run_id)
    else:
        dialect.notify(session, dialect.EVENTS_CHANNEL, run_id)
        if ends_run:
            queued_behind = execute(session, _QUEUED_BEHIND_OF_RUN,
                                    {"run_id": run_id}).scalar_one()
    if queued_behind:
        dialect.notify(session, dialect.QUEUE_CHANNEL, run.thread_id)
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
            end_reason=values.get("end_reason"),
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


def _checked(status: str, events: list[tuple[str, dict]]) -> tuple[str, list[_Pending]]:
    """The status the batch leaves the run in and its events' checked data; raises
    ``ValidationFailed`` or ``IllegalTransition`` for the first event that may not follow."""
    started_as = status
    pending: list[_Pending] = []
    for event_type, data in events:
        data = validated_data(event_type, data)
        if status in TERMINAL and started_as not in TERMINAL:
            # The run ends earlier in this very batch: the batch itself is malformed.
            raise IllegalTransition(f"{event_type} cannot follow the run's terminal event")
        status = next_status(status, event_type)
        pending.append(_Pending(event_type, dict(data)))
    return status, pending


def _chained(run_id: str, run, pending: list[_Pending], now: datetime) -> list[tuple]:
    """The event rows after the run's head: (run_id, seq, type, data JSON, created_at, hash,
    data), with gapless seqs and chained hashes."""
    first = run.last_event_seq + 1
    texts = [canonical_json(item.data) for item in pending]
    hashes = chained_hashes(run.last_event_hash, run_id, first,
                            [(item.type, text) for item, text in zip(pending, texts, strict=True)],
                            now)
    return [(run_id, first + i, item.type, texts[i], now, hashes[i], item.data)
            for i, item in enumerate(pending)]


def _events_in_advance(rows: list[tuple], now: datetime) -> dict[str, Any]:
    """The parameters of the events that go in with the head advance (PostgreSQL, at most
    ``_EVENTS_IN_ADVANCE_MAX``): one as ``event_*``, a few as ``events_*`` arrays."""
    run_id = rows[0][0]
    if len(rows) == 1:
        _run, seq, type_, _json, _at, chain, data = rows[0]
        return dict(zip(_APPENDED_EVENT_PARAMS, (run_id, seq, type_, data, now, chain),
                        strict=True))
    return {"events_run_id": run_id, "events_created_at": now,
            "events_seq": [r[1] for r in rows], "events_type": [r[2] for r in rows],
            "events_data": [r[3] for r in rows], "events_hash": [r[5] for r in rows]}


@functools.cache
def _optimistic_append(many: bool, changed: tuple[str, ...]):
    """An optimistic append's one statement (PostgreSQL): the compare-and-set of the head as a
    data-modifying CTE, and the events inserted only when it moved the head. All of a
    statement's CTEs run on one snapshot whether or not anything reads them, so events
    inserted beside the compare-and-set (as the locked path's are) would collide with the seqs
    of a writer that won the race (a unique violation: an ``ERROR`` in the server's log for
    every lost race, such as a cancel arriving during a stream); reading ``advanced`` makes
    the insert wait for the compare-and-set and write nothing when it failed. Built once per
    shape (one event or a few; ``changed``: the columns the advance sets, ``set_*``
    parameters). Its row count is the number of events inserted: 0 when the head moved."""
    t = AgentRun.__table__
    advanced = _ADVANCE_RUN_NOTIFYING.values(
        **{c: bindparam(f"set_{c}", type_=t.c[c].type) for c in changed}).cte("advanced")
    events = RunEvent.__table__
    if many:
        rows = _NEW_EVENT_ROWS
    else:
        rows = select(*(bindparam(name, type_=events.c[column].type)
                        for name, column in zip(_APPENDED_EVENT_PARAMS, _EVENT_COLUMNS,
                                                strict=True)))
    return (insert(events)
            .from_select(list(_EVENT_COLUMNS), rows.where(exists(select(advanced.c[0]))))
            .add_cte(advanced))


# The run's head as ``lock_run`` reads it, without the lock, and the clock read after it.
_HEAD = select(*LOCKED_RUN_COLUMNS,
               type_coerce(dialect.clock_column("postgresql"), UTCDateTime).label("now")
               ).where(AgentRun.id == bindparam("run_id"))
# Optimistic appends that lost to another writer before the locked path is taken.
_OPTIMISTIC_ATTEMPTS = 3


def append_events_alone(db: Database, run_id: str, events: list[tuple[str, dict]], *,
                        executor_instance_id: str, key: AppendKey | None = None) -> AppendResult:
    """An executor's append that is its own transaction: what ``append_events`` does in a
    ``db.write()`` of its own, with the same checks, rows, errors and result.

    On PostgreSQL a batch that does not end the run and whose events go in with the head
    advance (at most ``_EVENTS_IN_ADVANCE_MAX``, nothing to redact) is one statement: the run's
    head is read without a lock, then the advance, a compare-and-set on the status and seq that
    were read, and the events it lets in are one statement (``_optimistic_append``), which
    commits alone (no ``BEGIN``, no ``COMMIT``, no row lock held across round trips). If
    another writer moved the head in between, the compare-and-set fails, the statement writes
    nothing (and is no error), and the append starts again from the new head; after
    ``_OPTIMISTIC_ATTEMPTS`` such losses it waits for the row lock instead. The events are
    stamped with the clock read after the head, so stamps still follow seqs: an append that
    commits read the head after the previous append had committed.
    """
    if (db.is_postgres and not db.redactor.active and len(events) <= _EVENTS_IN_ADVANCE_MAX
            and not any(t in _ENDING for t, _ in events)):
        with db.autocommit_writes() as alone:
            assert alone is not None
            for _attempt in range(_OPTIMISTIC_ATTEMPTS):
                done = _append_alone(alone, run_id, events, executor_instance_id, key)
                if done is not None:
                    return done
    with db.write() as s:
        return append_events(s, run_id, events, executor_instance_id=executor_instance_id,
                             key=key)


def _append_alone(alone: AutocommitWrites, run_id: str, events: list[tuple[str, dict]],
                  executor_instance_id: str, key: AppendKey | None) -> AppendResult | None:
    """One optimistic attempt of ``append_events_alone``; None when another writer won."""
    if not events:
        raise ValueError("append_events needs at least one event")
    run = alone.read_one(_HEAD, {"run_id": run_id})
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    if (replay := replayed_append(run, key, len(events))) is not None:
        return replay
    now = run.now.astimezone(UTC)
    check_lease(run, executor_instance_id, now)
    status, pending = _checked(run.status, events)
    values: dict[str, Any] = {}
    for item in pending:
        values.update(row_changes(item.type, item.data, now))
    rows = _chained(run_id, run, pending, now)
    values.update(status=status, last_event_seq=rows[-1][1], last_event_hash=rows[-1][5])
    if key is not None:
        values.update(key.columns(rows[0][1]))
    statement = _optimistic_append(len(rows) > 1, tuple(sorted(values)))
    inserted = alone.write(statement, {
        "run_id_": run_id, "status_": run.status, "last_event_seq_": run.last_event_seq,
        **{f"set_{column}": value for column, value in values.items()},
        **_events_in_advance(rows, now)})
    if inserted.rowcount == 0:
        return None  # the head moved: another writer committed in between
    if inserted.rowcount != len(rows):  # pragma: no cover - the insert is all or nothing
        raise RuntimeError(f"run {run_id}: {inserted.rowcount} of {len(rows)} events went in")
    alone.notified(dialect.EVENTS_CHANNEL, run_id)
    return AppendResult(run_id=run_id, seqs=[r[1] for r in rows], status=status,
                        cancel_requested=status == "cancelling")


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

