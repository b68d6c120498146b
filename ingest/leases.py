"""Execution leases: claiming queued runs (per-thread FIFO) and renewing a held lease.

A lease is two columns, ``executor_instance_id`` and ``lease_expires_at``, compared with the
database clock. Holding one says only that an executor is alive; its expiry is handled by the
reconciler (``run.interrupted``), never by running the model again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Integer,
    and_,
    any_,
    bindparam,
    exists,
    func,
    null,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.orm import Session, aliased

from agentledger.core import dialect
from agentledger.core.config import (
    MAX_CLAIM,
    MAX_INSTANCE_ID_LENGTH,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
)
from agentledger.core.database import read_all
from agentledger.core.driver_statements import one_of
from agentledger.core.errors import IllegalTransition, LeaseLost, NotFound, ValidationFailed
from agentledger.core.schema import AgentRun, ContextBlob
from agentledger.core.vocabulary import ACTIVE, RECORDED_EXECUTOR_PREFIX, TERMINAL
from ingest.events import LOCKED_RUN_COLUMNS, check_lease, lease_deadline, start_locked_runs
from ingest.state_machine import Lease
from queries.thread_history import as_turns, thread_history

# A run leased before its grant was recorded (no ``last_heartbeat_at``): never after a claim.
DEFAULT_LEASE_SECONDS = 30


@dataclass(frozen=True)
class ClaimedRun:
    run_id: str
    thread_id: str
    root_run_id: str
    parent_run_id: str | None
    input: str
    agent_execution_snapshot: dict[str, Any]
    context_pack_snapshot: dict[str, Any]
    context: list[dict[str, Any]]
    lease_expires_at: datetime
    # The thread's earlier turns (CONTRACT §7). They are fixed once the run is claimable (its
    # thread's earlier runs have all ended: per-thread FIFO), so reading them later gives the
    # same answer; None when the claim did not read them (``with_history=False``).
    history: list[dict[str, Any]] | None = field(default_factory=list)


def check_executor_instance_id(executor_instance_id: str) -> None:
    """Refuse a claim under no name, a name longer than the column holds, or the name that runs
    recorded from traces carry: those hold no lease, and lease health leaves them out of its
    executors, where a live executor must show."""
    if not 1 <= len(executor_instance_id) <= MAX_INSTANCE_ID_LENGTH:
        raise ValidationFailed(
            f"executor_instance_id must be 1 to {MAX_INSTANCE_ID_LENGTH} characters")
    if executor_instance_id.startswith(RECORDED_EXECUTOR_PREFIX):
        raise ValidationFailed(
            f"executor_instance_id must not start with {RECORDED_EXECUTOR_PREFIX!r}: that prefix "
            "names the services whose runs were recorded from their traces"
        )


def _check_lease_seconds(lease_seconds: float) -> None:
    if not MIN_LEASE_SECONDS <= lease_seconds <= MAX_LEASE_SECONDS:
        raise ValidationFailed(
            f"lease_seconds must be between {MIN_LEASE_SECONDS} and {MAX_LEASE_SECONDS}"
        )


# Built once, not per claim: creating an alias copies every column of ``agent_run``.
_OTHER_RUN = aliased(AgentRun, name="other_run")
_EARLIER_RUN = aliased(AgentRun, name="earlier_run")
_PARENT_RUN = aliased(AgentRun, name="parent_run")


def _parent_not_ended():
    """A child run is claimable only while its parent has not ended: a queued child of an
    ended parent is the reconciler's to interrupt (``parent_terminal``), never to start, even
    when a worker claims before the reconciler's next pass (a worker started again at once
    after stopping ends its parents and would start their queued children). A scalar
    subquery, which PostgreSQL runs only for child runs: a root stops at ``parent_run_id IS
    NULL`` (an ``EXISTS`` may be planned as a hash of every ended run)."""
    parent_status = (select(_PARENT_RUN.status)
                     .where(_PARENT_RUN.id == AgentRun.parent_run_id).scalar_subquery())
    return or_(AgentRun.parent_run_id.is_(None), ~one_of(parent_status, TERMINAL))


def claimable_runs_query(max_runs):
    """Queued runs that are first in line on their thread and whose thread has no active run."""
    other, earlier = _OTHER_RUN, _EARLIER_RUN
    return (
        select(AgentRun.id)
        .where(
            AgentRun.status == "queued",
            _parent_not_ended(),
            ~exists().where(other.thread_id == AgentRun.thread_id, other.status.in_(ACTIVE)),
            ~exists().where(
                and_(
                    earlier.thread_id == AgentRun.thread_id,
                    earlier.status == "queued",
                    tuple_(earlier.created_at, earlier.id) < tuple_(AgentRun.created_at, AgentRun.id),
                )
            ),
        )
        .order_by(AgentRun.created_at, AgentRun.id)
        .limit(max_runs)
    )


def first_in_line_query(max_runs):
    """PostgreSQL: ``claimable_runs_query`` shaped so that its cost grows with the queue, not
    with its square: the first queued run of each thread in one pass (``DISTINCT ON``), then
    one index probe per candidate for an active run of its thread (a correlated subquery
    fenced with ``OFFSET 0``, so that it stays one). Planned from statistics in which queued
    runs are rare, the anti-joins of ``claimable_runs_query`` scanned every queued and every
    active run for each queued run: 55 ms for 200 queued runs, against 1.7 ms this way."""
    queued = _EARLIER_RUN
    first = (select(queued.id).where(queued.status == "queued")
             .distinct(queued.thread_id)
             .order_by(queued.thread_id, queued.created_at, queued.id))
    # ``one_of``, not ``in_``: a fixed SQL, which lets ``claim_runs`` run it on the driver.
    active = (select(_OTHER_RUN.id)
              .where(_OTHER_RUN.thread_id == AgentRun.thread_id, one_of(_OTHER_RUN.status, ACTIVE))
              .offset(0))
    return (
        select(AgentRun.id)
        # ``= ANY(ARRAY(…))``: the candidates are computed once (an InitPlan), whatever the
        # planner guesses of the queue's size; ``IN (…)`` became a semi-join rescanning them
        # for each queued run.
        .where(AgentRun.status == "queued",
               AgentRun.id == any_(func.array(first.scalar_subquery())), ~exists(active),
               _parent_not_ended())
        .order_by(AgentRun.created_at, AgentRun.id)
        .limit(max_runs)
    )


_CLAIM_STATEMENTS: dict[str, Any] = {}

# PostgreSQL: of the parents of child runs a claim chose, those that have not ended, share-
# locked until the claim commits. The choice read each parent's status in the claim
# statement's snapshot, and a parent's ending does not lock its children: without this lock a
# child could be started after its parent had ended (the ending committing between the choice
# and the claim's commit). A parent being ended holds its row until it commits; the share lock
# conflicts with that, and the status is read again on the row's latest version. SKIP LOCKED,
# not a wait: the claim already holds the children, and a cancel locks a parent before its
# children, so waiting here could deadlock with it. A child whose parent is locked at this
# instant (its end, its cancel, a heartbeat) stays queued for a later claim.
_PARENTS_NOT_ENDED = (
    select(AgentRun.id)
    .where(AgentRun.id.in_(bindparam("parent_ids", expanding=True)),
           AgentRun.status.not_in(TERMINAL))
    .with_for_update(read=True, skip_locked=True)
)


def _children_of_live_parents(session: Session, chosen: list) -> list:
    """``chosen`` (the claim's locked rows) less the child runs whose parent has ended or is
    locked now (``_PARENTS_NOT_ENDED``)."""
    parents = sorted({row.parent_run_id for row in chosen if row.parent_run_id})
    if not parents or dialect.name(session) != "postgresql":
        return chosen
    live = set(session.execute(_PARENTS_NOT_ENDED, {"parent_ids": parents}).scalars())
    return [row for row in chosen if row.parent_run_id is None or row.parent_run_id in live]

# What a claim reads of each run it locks: what an append checks under the run's lock (so
# ``run.started`` needs no second lock statement) and what the executor needs to run it.
_CLAIMED_COLUMNS = (*LOCKED_RUN_COLUMNS, AgentRun.root_run_id, AgentRun.input,
                    AgentRun.agent_execution_snapshot, AgentRun.context_pack_snapshot)


def _claim_statement(session: Session):
    # Built once per dialect: every claim loop turn runs it, and building it (two correlated
    # subqueries) and walking it for SQLAlchemy's cache key cost more than the claim's SQL.
    key = dialect.name(session)
    if key not in _CLAIM_STATEMENTS:
        # The rows chosen and locked and the clock in one round trip: the clock is read after
        # the choice, which the end of each thread's previous run decided.
        shape = first_in_line_query if key == "postgresql" else claimable_runs_query
        stmt = dialect.locked_with_clock(
            shape(bindparam("max_runs", type_=Integer)).with_only_columns(*_CLAIMED_COLUMNS),
            key, skip_locked=True, order_by=("created_at", "id"))
        _CLAIM_STATEMENTS[key] = stmt
    return _CLAIM_STATEMENTS[key]


def claim_runs(
    session: Session, executor_instance_id: str, *, max_runs: int = 1, lease_seconds: float = 30,
    with_history: bool = True,
) -> list[ClaimedRun]:
    """Lease up to ``max_runs`` queued runs to this executor and append ``run.started`` to each.

    ``with_history=False`` leaves the thread's turns out (``history`` None): an executor that
    reads them only if its agent asks (``queries.thread_history``) saves that read per claim.

    On PostgreSQL concurrent claimers skip each other's locked rows (``FOR NO KEY UPDATE SKIP LOCKED``);
    on SQLite the ``BEGIN IMMEDIATE`` write lock makes claims one at a time.
    """
    check_executor_instance_id(executor_instance_id)
    _check_lease_seconds(lease_seconds)
    if not 1 <= max_runs <= MAX_CLAIM:
        raise ValidationFailed(f"max_runs must be between 1 and {MAX_CLAIM}")
    # On PostgreSQL through the connection's driver (``core.database.read_all``): every turn of
    # every executor's claim loop runs it, a third of them finding nothing when two workers
    # wake for one queued run, and SQLAlchemy's execution of this statement cost more than the
    # rest of an empty claim.
    chosen = _children_of_live_parents(
        session, read_all(session, _claim_statement(session), {"max_runs": max_runs}))
    if not chosen:
        return []
    # After the claimable rows were chosen: a run's start is never stamped before the end of
    # the previous run of its thread, which that choice depended on.
    now = dialect.now(session, read=chosen[0].now)
    expires = lease_deadline(now, lease_seconds)
    start_locked_runs(session, chosen, Lease(executor_instance_id, expires), now)
    return [_claimed(session, row, expires, with_history) for row in chosen]


def claim_run(
    session: Session, run_id: str, executor_instance_id: str, *, lease_seconds: float = 30
) -> ClaimedRun:
    """Lease one specific queued run, if it is first in line on its thread.

    Used by imports and tools that execute a known run; raises ``IllegalTransition`` when the
    run is not claimable now (not queued, or an earlier run of its thread comes first).
    """
    check_executor_instance_id(executor_instance_id)
    _check_lease_seconds(lease_seconds)
    found = session.execute(
        dialect.for_update(
            claimable_runs_query(1).with_only_columns(*_CLAIMED_COLUMNS, null().label("now"))
            .where(AgentRun.id == run_id), session, skip_locked=True
        )
    ).one_or_none()
    if found is None or not _children_of_live_parents(session, [found]):
        raise IllegalTransition(f"run {run_id} is not claimable now")
    now = dialect.now(session)
    return _start(session, found, executor_instance_id, now, lease_seconds)


def _start(session: Session, row, executor_instance_id: str, now: datetime,
           lease_seconds: float, with_history: bool = True) -> ClaimedRun:
    """``row``: the run as the claim read and locked it (``_CLAIMED_COLUMNS``)."""
    expires = lease_deadline(now, lease_seconds)
    start_locked_runs(session, [row], Lease(executor_instance_id, expires), now)
    return _claimed(session, row, expires, with_history)


def _claimed(session: Session, row, expires: datetime,
             with_history: bool = True) -> ClaimedRun:
    run_id = row.id
    items = row.context_pack_snapshot.get("items", [])
    contents = {}
    if items:
        contents = dict(
            session.execute(
                select(ContextBlob.sha256, ContextBlob.content).where(
                    ContextBlob.sha256.in_([i["sha256"] for i in items])
                )
            ).tuples().all()
        )
    return ClaimedRun(
        run_id=run_id,
        thread_id=row.thread_id,
        root_run_id=row.root_run_id,
        parent_run_id=row.parent_run_id,
        input=row.input,
        agent_execution_snapshot=row.agent_execution_snapshot,
        context_pack_snapshot=row.context_pack_snapshot,
        context=[{**i, "content": contents.get(i["sha256"])} for i in items],
        lease_expires_at=expires,
        history=as_turns(thread_history(session, run_id)) if with_history else None,
    )


@dataclass(frozen=True)
class Heartbeat:
    lease_expires_at: datetime
    cancel_requested: bool


def _granted_seconds(session: Session, held: tuple) -> float:
    """How long the lease ``held`` selects was last granted for (locked: the heartbeat's
    update follows); a run with no grant recorded gets ``DEFAULT_LEASE_SECONDS``."""
    granted = session.execute(
        dialect.for_update(select(AgentRun.lease_expires_at, AgentRun.last_heartbeat_at)
                           .where(*held), session)
    ).first()
    if granted is None or granted.last_heartbeat_at is None:
        return DEFAULT_LEASE_SECONDS
    length = (granted.lease_expires_at - granted.last_heartbeat_at).total_seconds()
    return min(max(length, MIN_LEASE_SECONDS), MAX_LEASE_SECONDS)


def heartbeat(
    session: Session, run_id: str, executor_instance_id: str, *,
    lease_seconds: float | None = None,
) -> Heartbeat:
    """Extend a live lease held by this executor; ``LeaseLost`` means stop working on the run.

    ``lease_seconds`` None renews it for as long as it was last granted (the claim's
    ``lease_seconds``, or the last heartbeat's): the executor routes' heartbeat, whose caller
    chose its lease when it claimed and must not see a heartbeat shorten it. A grant is always
    ``lease_expires_at - last_heartbeat_at``: the claim and every heartbeat set both.
    """
    if lease_seconds is not None:
        _check_lease_seconds(lease_seconds)
    now = dialect.now(session)
    held = (AgentRun.id == run_id, AgentRun.executor_instance_id == executor_instance_id,
            AgentRun.status.in_(ACTIVE), AgentRun.lease_expires_at > now)
    seconds = lease_seconds if lease_seconds is not None else _granted_seconds(session, held)
    expires = lease_deadline(now, seconds)
    row = session.execute(
        update(AgentRun)
        .where(*held)
        .values(lease_expires_at=expires, last_heartbeat_at=now)
        .returning(AgentRun.status)
    ).first()
    if row is None:
        if session.execute(select(AgentRun.id).where(AgentRun.id == run_id)).first() is None:
            raise NotFound(f"run {run_id} does not exist")
        raise LeaseLost(f"executor {executor_instance_id} does not hold the lease of run {run_id}")
    return Heartbeat(lease_expires_at=expires, cancel_requested=row.status == "cancelling")


def leased_thread(session: Session, run_id: str, executor_instance_id: str) -> str:
    """The thread of a run whose live lease this executor holds: what the memory routes check
    before they touch the thread's framework memory. ``NotFound`` for no such run; otherwise
    the appends' own check (``LeaseLost``: another instance's lease, an expired one, an ended
    run). A read only: the framework writes on a connection of its own, which a lock held here
    would block on SQLite; the executor's ``WriteFence`` closes before the run's end is written."""
    row = session.execute(
        select(AgentRun.id, AgentRun.status, AgentRun.thread_id, AgentRun.executor_instance_id,
               AgentRun.lease_expires_at).where(AgentRun.id == run_id)
    ).first()
    if row is None:
        raise NotFound(f"run {run_id} does not exist")
    check_lease(row, executor_instance_id, dialect.now(session))
    return row.thread_id
