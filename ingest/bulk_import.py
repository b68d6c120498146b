"""Bulk historical import: complete run histories written at COPY speed.

Another system's history (or ``agentledger demo seed`` at scale) is described with plain
dataclasses — ``ImportedSession``, ``ImportedRun`` (with nested child runs) and
``ImportedEvent`` — and written in batches, each batch in one transaction: PostgreSQL gets
``COPY … FROM STDIN`` on the SQLAlchemy connection's psycopg connection, SQLite gets
``executemany``. Every run is checked before its batch writes anything, with the same rules
as live traffic: each event's data against its type (``event_types.validated_data``), every
transition against ``state_machine.next_status`` (the first event is ``run.queued``, written
here; exactly one terminal event, and it is the last), times that never go backwards, agent
versions that exist (register them through ``ingest.agents`` first), and child runs announced
by a ``run.child_created`` of their parent. The rows are exactly what the live path would have
stored: both frozen snapshots, the user and assistant messages, gapless seqs and the hash chain
(``agentledger verify`` accepts them), the run head, leases, error, final message and times.
Each batch also adds its runs to the outcome rollups (``ingest.rollup``) in the same
transaction: the minute rollup only the runs created within the minutes kept when the import
started.

A refused history raises before its batch writes anything; batches before it stay committed.
Imported runs are always terminal, so a live worker never sees (or claims) one.

Checking and building a batch is Python work (validation, canonical JSON, the hash chain), and
writing it is mostly the database's. ``workers=N`` prepares batches in N other processes while
this one writes them, in order, each in its own transaction: the rows are exactly those the
in-process path builds; on PostgreSQL they hand back each table as ready COPY data. Without
workers a helper thread prepares the next batch (the GIL lets that overlap only with the
database's share of the work). A history that can build its own parts is better given as
shares (``bulk_import_shares``): each is called in the process that prepares its batch, so its
trees are never pickled between processes.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import multiprocessing.connection
import operator
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from agentledger.core import dialect
from agentledger.core.database import Database
from agentledger.core.errors import IllegalTransition, LedgerError, UnknownAgent, ValidationFailed
from agentledger.core.hashing import (
    GENESIS_HASH,
    answer_sha256,
    canonical_json,
    event_hash_of_json,
    input_sha256,
    sha256_hex,
)
from agentledger.core.ids import new_id
from agentledger.core.outcome_sums import usage_totals
from agentledger.core.rollup_periods import minutes_kept_from
from agentledger.core.schema import (
    AgentRun,
    AgentVersion,
    ChatSession,
    ContextBlob,
    ConversationThread,
    Message,
    RunEvent,
)
from agentledger.core.vocabulary import TERMINAL
from ingest.event_types import validated_data
from ingest.events import NOT_REDACTED
from ingest.rollup import RollupBatch, RunOutcome
from ingest.runs import (
    ContextItem,
    context_pack,
    idempotency_key_hash,
    redacted_context,
    request_checksum,
    snapshot_of,
)
from ingest.state_machine import EVENT_TARGET, Lease, next_status, row_changes

DEFAULT_BATCH_RUNS = 2000


@dataclass
class ImportedEvent:
    """One event after ``run.queued`` (which the importer writes itself, at ``created_at``)."""

    type: str
    data: dict[str, Any]
    at: datetime


@dataclass
class ImportedSession:
    owner_id: str
    agent_id: str  # the session's default agent (as it is at the end of the history)
    created_at: datetime
    title: str | None = None
    id: str = field(default_factory=lambda: new_id("sess"))
    thread_id: str = field(default_factory=lambda: new_id("thr"))
    updated_at: datetime | None = None


@dataclass
class ImportedRun:
    """One run's whole life. Root runs of a conversation name their session (a new
    ``ImportedSession``, written with the first batch that uses it, or the id of a session that
    exists); child runs are listed in their parent's ``children`` and announced by a
    ``run.child_created`` event of the parent with ``{"child_run_id": child.id, "agent_id": …}``.
    """

    agent_id: str
    agent_version: int
    input: str
    created_at: datetime
    events: list[ImportedEvent]
    owner_id: str | None = None  # defaults to the session's owner (root) or the parent's (child)
    session: ImportedSession | str | None = None
    children: list[ImportedRun] = field(default_factory=list)
    context: list[ContextItem] = field(default_factory=list)  # root runs; children inherit
    id: str = field(default_factory=lambda: new_id("run"))
    idempotency_key: str | None = None
    lease_expires_at: datetime | None = None  # default: from the last run.started event
    last_heartbeat_at: datetime | None = None  # default: when it started
    # Replacements AGENTLEDGER_REDACT made before this run reached the importer (the OTLP
    # receiver redacts spans as it stores them), added to its redaction_count.
    prior_redactions: int = 0


class HistoryShare(Protocol):
    """A part of a history that builds its own root runs where its batch is prepared (see
    ``BulkImporter.run_shares``): picklable, and the new sessions (``ImportedSession``) of
    its runs are used by no other share."""

    def __call__(self) -> list[ImportedRun]: ...


@dataclass
class ImportReport:
    runs: int = 0
    events: int = 0
    messages: int = 0
    sessions: int = 0
    batches: int = 0
    seconds: float = 0.0

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def runs_per_second(self) -> float:
        return self.runs / self.seconds if self.seconds else 0.0


_RUN_COLUMNS = (
    "id", "thread_id", "session_id", "root_run_id", "parent_run_id", "owner_id", "agent_id",
    "agent_version", "status", "agent_execution_snapshot", "context_pack_snapshot", "input",
    "user_message_id", "last_event_seq", "last_event_hash", "executor_instance_id",
    "lease_expires_at", "last_heartbeat_at", "idempotency_key_hash", "request_checksum",
    "final_message_id", "error", "created_at", "started_at", "finished_at", "end_reason",
    "redaction_count", "usage_input_tokens", "usage_output_tokens", "usage_cost_usd",
)
_RUN_ROW = operator.itemgetter(*_RUN_COLUMNS)  # a run's dict as a COPY row
_JSON_RUN_COLUMNS = ("agent_execution_snapshot", "context_pack_snapshot", "error")
_MESSAGE_COLUMNS = ("id", "session_id", "thread_id", "owner_id", "role", "content", "run_id",
                    "created_at")
_EVENT_COLUMNS = ("run_id", "seq", "type", "data", "created_at", "hash")
_THREAD_COLUMNS = ("id", "owner_id", "created_at")
_SESSION_COLUMNS = ("id", "owner_id", "title", "agent_id", "thread_id", "created_at",
                    "updated_at", "deleted_at")


def _aware(moment: datetime, where: str, seq: int | None = None) -> datetime:
    if not isinstance(moment, datetime) or moment.tzinfo is None:
        where = where if seq is None else f"{where} seq {seq}"  # named only when refused
        raise ValidationFailed(f"{where}: times must be timezone-aware datetimes")
    return moment


class _Batch:
    """The rows of one batch, built and checked before anything is written."""

    def __init__(self, minutes_from: datetime) -> None:
        self.threads: list[tuple] = []
        self.sessions: list[tuple] = []
        self.runs: list[dict] = []
        self.messages: list[tuple] = []
        self.events: list[tuple] = []  # (run_id, seq, type, data_json, created_at, hash, data)
        self.blobs: dict[str, str] = {}
        self.rollup = RollupBatch(minutes_from=minutes_from)
        self.root_runs = 0
        # PostgreSQL: (table, columns, COPY data) per table, once ``format_for_copy`` ran; the
        # rows above are dropped then, and the counts kept here
        self.copy_payloads: list[tuple[str, tuple[str, ...], bytes]] | None = None
        self.counts = (0, 0, 0, 0)

    def tally(self) -> tuple[int, int, int, int]:
        """(runs, events, messages, sessions) of the batch."""
        if self.copy_payloads is not None:
            return self.counts
        return len(self.runs), len(self.events), len(self.messages), len(self.sessions)

    def format_for_copy(self, session: Session) -> None:
        """Turn the rows into COPY data with the session's psycopg connection (nothing is
        sent): done where the batch is prepared, so that another process hands back a few
        bytes objects instead of every row."""
        if self.copy_payloads is not None:
            return
        self.counts = self.tally()
        tables = [
            ("conversation_thread", _THREAD_COLUMNS, self.threads),
            ("chat_session", _SESSION_COLUMNS, self.sessions),
            ("agent_run", _RUN_COLUMNS, [_RUN_ROW(run) for run in self.runs]),
            ("message", _MESSAGE_COLUMNS, self.messages),
            ("run_event", _EVENT_COLUMNS, [row[:6] for row in self.events]),
        ]
        self.copy_payloads = [
            (table, columns, dialect.copy_bytes(session, table, columns, rows))
            for table, columns, rows in tables if rows]
        self.threads, self.sessions, self.runs, self.messages, self.events = [], [], [], [], []


class BulkImporter:
    """Writes ``ImportedRun`` trees in batches (see the module docstring)."""

    def __init__(self, db: Database, *, batch_runs: int = DEFAULT_BATCH_RUNS,
                 progress: Callable[[int], object] | None = None, workers: int = 0,
                 minutes_from: datetime | None = None):
        if batch_runs < 1:
            raise ValueError("batch_runs must be at least 1")
        if workers < 0:
            raise ValueError("workers must be 0 or more")
        if workers and db.url.startswith("sqlite") and ":memory:" in db.url:
            raise ValueError("an in-memory SQLite database cannot be prepared for in other "
                             "processes; use workers=0")
        self.db = db
        self.batch_runs = batch_runs
        self.progress = progress
        self.workers = workers
        # Runs created since then are added to the minute rollup too (the minutes kept when
        # the import starts; ``agentledger.core.rollup_periods``).
        self.minutes_from = minutes_from or minutes_kept_from(datetime.now(UTC))
        self._snapshots: dict[tuple[str, int], tuple[dict, str]] = {}
        self._sessions_written: set[str] = set()
        self._existing_sessions: dict[str, tuple[str, str]] = {}
        self.report = ImportReport()

    # --- checking and building ---------------------------------------------------------------

    def _snapshot(self, session: Session, agent_id: str, version: int) -> tuple[dict, str]:
        key = (agent_id, version)
        found = self._snapshots.get(key)
        if found is None:
            rows = session.execute(
                select(AgentVersion).where(AgentVersion.agent_id == agent_id)
            ).scalars().all()
            for row in rows:
                snap = snapshot_of(row)
                self._snapshots[(row.agent_id, row.version)] = (snap, canonical_json(snap))
            found = self._snapshots.get(key)
            if found is None:
                raise UnknownAgent(f"agent {agent_id!r} version {version} is not registered")
        return found

    def _session_of(self, session: Session, batch: _Batch, chat: ImportedSession | str):
        """(session id, thread id, owner) of a root run's session, adding new ones to the batch."""
        if isinstance(chat, str):
            found = self._existing_sessions.get(chat)
            if found is None:
                row = session.execute(
                    select(ChatSession.thread_id, ChatSession.owner_id).where(ChatSession.id == chat)
                ).one_or_none()
                if row is None:
                    raise ValidationFailed(f"session {chat} does not exist")
                found = self._existing_sessions[chat] = (row.thread_id, row.owner_id)
            return chat, found[0], found[1]
        if chat.id not in self._sessions_written:
            created = _aware(chat.created_at, f"session {chat.id}")
            self._snapshot(session, chat.agent_id, 1)  # the default agent must exist
            batch.threads.append((chat.thread_id, chat.owner_id, created))
            batch.sessions.append((chat.id, chat.owner_id, chat.title, chat.agent_id,
                                   chat.thread_id, created, chat.updated_at or created, None))
            self._sessions_written.add(chat.id)
        return chat.id, chat.thread_id, chat.owner_id

    def _add_tree(self, session: Session, batch: _Batch, run: ImportedRun) -> None:
        if run.session is not None:
            session_id, thread_id, owner = self._session_of(session, batch, run.session)
            if run.owner_id is not None and run.owner_id != owner:
                raise ValidationFailed(f"run {run.id}: owner differs from its session's owner")
        else:
            if run.owner_id is None:
                raise ValidationFailed(f"run {run.id}: a run without a session needs owner_id")
            session_id, owner = None, run.owner_id
            thread_id = new_id("thr")
            batch.threads.append((thread_id, owner, _aware(run.created_at, f"run {run.id}")))
        context = list(run.context)
        redactor = self.db.redactor.for_run()
        if redactor.active:  # the tree's pack: counted on its root run
            context = redacted_context(redactor, context)
        pack, blobs = context_pack(context)
        batch.blobs.update(blobs)
        self._add_run(session, batch, run, session_id=session_id, thread_id=thread_id,
                      owner=owner, root_id=run.id, parent=None, pack_json=canonical_json(pack),
                      redactions=redactor.count)
        batch.root_runs += 1

    def _add_run(self, session: Session, batch: _Batch, run: ImportedRun, *, session_id,
                 thread_id, owner, root_id, parent: ImportedRun | None, pack_json: str,
                 redactions: int = 0) -> None:
        where = f"run {run.id}"
        created = _aware(run.created_at, where)
        snapshot, snapshot_json = self._snapshot(session, run.agent_id, run.agent_version)
        if not isinstance(run.input, str):
            raise ValidationFailed(f"{where}: input must be text")
        # Redacted before anything is built of it (AGENTLEDGER_REDACT), like the live path.
        redactor = self.db.redactor.for_run()
        run_input = redactor.text(run.input)

        # The snapshots' digests (hashing.snapshot_sha256) over the canonical JSON they are
        # stored as, which is already at hand.
        queued = {"agent_id": run.agent_id, "session_id": session_id,
                  "parent_run_id": parent.id if parent else None,
                  "input_sha256": input_sha256(run_input),
                  "agent_snapshot_sha256": sha256_hex(snapshot_json),
                  "context_pack_sha256": sha256_hex(pack_json)}
        pending: list[tuple[str, dict, datetime]] = [("run.queued", queued, created)]
        status, previous = "queued", created
        changes: dict[str, Any] = {}  # what the events do to the run row (state_machine.row_changes)
        lease = None
        announced: dict[str, datetime] = {}
        told: list[tuple[int, str, Any]] = []  # run.child_finished: seq, child, status
        deltas: list[str] = []
        answer: str | None = None
        for n, event in enumerate(run.events, start=2):
            at = _aware(event.at, where, n)
            if at < previous:
                raise ValidationFailed(f"{where} seq {n}: event time goes backwards")
            previous = at
            try:
                data = validated_data(event.type, event.data)  # a copy of its own
                status_after = next_status(status, event.type)
                if redactor.active and event.type not in NOT_REDACTED:
                    data = redactor.value(data)
            except LedgerError as exc:
                raise type(exc)(f"{where} seq {n}: {exc.message}") from exc
            if event.type == "run.started":
                lease = data.get("lease_expires_at")
                changes.update(row_changes(event.type, data, at, lease=Lease(
                    data["executor_instance_id"], _lease_time(run, lease, where))))
            elif event.type == "message.delta":
                deltas.append(str(data.get("text", "")))
            elif event.type == "run.child_created":
                announced[str(data.get("child_run_id"))] = at
            elif event.type == "run.child_finished":
                told.append((n, str(data.get("child_run_id")), data.get("status")))
            elif event.type == "run.completed":
                content = data.pop("content", None)
                answer = redactor.text("".join(deltas) if content is None else content)
                data["final_message_id"] = None  # named below, once the message has its id
            if event.type != "run.started":
                changes.update(row_changes(event.type, data, at))
            status = status_after
            pending.append((event.type, data, at))
        if status not in TERMINAL:
            raise IllegalTransition(f"{where}: an imported history must end in a terminal event")
        child_ids = [c.id for c in run.children]
        if set(child_ids) != set(announced) or len(child_ids) != len(set(child_ids)):
            raise ValidationFailed(f"{where}: its children and its run.child_created events differ")
        _check_children_told(where, run, told)

        finished_at = changes["finished_at"]
        started_at = changes.get("started_at")
        final_message_id = None
        if answer is not None:
            final_message_id = new_id("msg")
            batch.messages.append((final_message_id, session_id, thread_id, owner, "assistant",
                                   answer, run.id, finished_at))
        user_message_id = None
        if session_id is not None and parent is None:
            user_message_id = new_id("msg")
            batch.messages.append((user_message_id, session_id, thread_id, owner, "user",
                                   run_input, run.id, created))

        chain, seq = GENESIS_HASH, 0
        usage = []
        for event_type, data, at in pending:
            seq += 1
            if event_type == "run.completed":
                data["final_message_id"] = final_message_id
                if answer is not None:
                    data["content_sha256"] = answer_sha256(answer)
            elif event_type == "usage":
                usage.append(data)
            data_json = canonical_json(data)
            chain = event_hash_of_json(chain, run.id, seq, event_type, data_json, at)
            batch.events.append((run.id, seq, event_type, data_json, at, chain, data))

        key_hash = checksum = None
        if run.idempotency_key is not None:
            key_hash = idempotency_key_hash(run.idempotency_key)
            checksum = request_checksum(f"/api/sessions/{session_id}/messages",
                                        {"content": run_input})
        tokens_in, tokens_out, cost = usage_totals(usage)
        batch.runs.append({
            "id": run.id, "thread_id": thread_id, "session_id": session_id,
            "root_run_id": root_id, "parent_run_id": parent.id if parent else None,
            "owner_id": owner, "agent_id": run.agent_id, "agent_version": run.agent_version,
            "status": status, "agent_execution_snapshot": snapshot_json,
            "context_pack_snapshot": pack_json, "input": run_input,
            "user_message_id": user_message_id, "last_event_seq": seq, "last_event_hash": chain,
            "executor_instance_id": changes.get("executor_instance_id"),
            "lease_expires_at": changes.get("lease_expires_at"),
            "last_heartbeat_at": run.last_heartbeat_at or started_at,
            "idempotency_key_hash": key_hash, "request_checksum": checksum,
            "final_message_id": final_message_id,
            "error": None if changes.get("error") is None else canonical_json(changes["error"]),
            "created_at": created, "started_at": started_at, "finished_at": finished_at,
            "end_reason": changes.get("end_reason"),
            "redaction_count": redactions + run.prior_redactions + redactor.count,
            "usage_input_tokens": tokens_in, "usage_output_tokens": tokens_out,
            "usage_cost_usd": cost,
        })
        batch.rollup.add(RunOutcome(run.agent_id, run.agent_version, status, created, started_at,
                                    finished_at, tokens_in, tokens_out, cost,
                                    changes.get("end_reason")))
        del snapshot

        for child in run.children:
            if _aware(child.created_at, f"run {child.id}") < announced[child.id]:
                raise ValidationFailed(f"run {child.id}: created before its parent announced it")
            if child.session is not None or (child.owner_id not in (None, owner)):
                raise ValidationFailed(f"run {child.id}: a child run has no session and its "
                                       "parent's owner")
            child_thread = new_id("thr")
            batch.threads.append((child_thread, owner, child.created_at))
            self._add_run(session, batch, child, session_id=None, thread_id=child_thread,
                          owner=owner, root_id=root_id, parent=run, pack_json=pack_json)

    # --- writing -----------------------------------------------------------------------------

    def _write(self, session: Session, batch: _Batch) -> None:
        if dialect.name(session) == "postgresql":
            self._copy(session, batch)
        else:
            self._executemany(session, batch)
        if batch.blobs:
            session.execute(
                dialect.insert_ignoring_conflicts(session, ContextBlob.__table__, ["sha256"]),
                [{"sha256": k, "content": v} for k, v in sorted(batch.blobs.items())],
            )
        batch.rollup.write(session)

    @staticmethod
    def _copy(session: Session, batch: _Batch) -> None:
        batch.format_for_copy(session)
        assert batch.copy_payloads is not None
        for table, columns, data in batch.copy_payloads:  # parents before the rows naming them
            dialect.copy_data(session, table, columns, data)

    @staticmethod
    def _executemany(session: Session, batch: _Batch) -> None:
        if batch.threads:
            session.execute(insert(ConversationThread),
                            [dict(zip(_THREAD_COLUMNS, r, strict=True)) for r in batch.threads])
        if batch.sessions:
            session.execute(insert(ChatSession),
                            [dict(zip(_SESSION_COLUMNS, r, strict=True)) for r in batch.sessions])
        runs = []
        for run in batch.runs:
            row = dict(run)
            for column in _JSON_RUN_COLUMNS:
                if row[column] is not None:
                    row[column] = json.loads(row[column])
            runs.append(row)
        session.execute(insert(AgentRun), runs)
        if batch.messages:
            session.execute(insert(Message),
                            [dict(zip(_MESSAGE_COLUMNS, r, strict=True)) for r in batch.messages])
        session.execute(insert(RunEvent), [
            {"run_id": r[0], "seq": r[1], "type": r[2], "data": r[6], "created_at": r[4],
             "hash": r[5]} for r in batch.events
        ])

    def _prepare(self, trees: list[ImportedRun]) -> _Batch:
        """Check and build a batch's rows (as COPY data on PostgreSQL). Its few look-ups
        (agent versions, existing sessions) read the primary on PostgreSQL (a read replica may
        lag behind agents registered just before the import) in a transaction that is rolled
        back; SQLite reads in a read-only transaction so that it does not take the write lock
        the batch being written holds."""
        batch = _Batch(self.minutes_from)
        if self.db.is_postgres:
            with Session(self.db.engine, autoflush=False) as session:
                try:
                    for tree in trees:
                        self._add_tree(session, batch, tree)
                    batch.format_for_copy(session)
                finally:
                    session.rollback()
        else:
            with self.db.read(primary=True) as session:
                for tree in trees:
                    self._add_tree(session, batch, tree)
        return batch

    def prepare(self, trees: list[ImportedRun]) -> _Batch:
        """Check and build the rows of ``trees`` (nothing is written), for a caller that writes
        them with ``write_prepared`` inside a transaction of its own."""
        return self._prepare(trees)

    def prepare_in(self, session: Session, trees: list[ImportedRun]) -> _Batch:
        """Check and build the rows of ``trees`` with the caller's session for the look-ups: a
        PostgreSQL write transaction that writes them next (one connection and transaction
        fewer). Not for SQLite, whose write transaction holds the database's write lock."""
        batch = _Batch(self.minutes_from)
        for tree in trees:
            self._add_tree(session, batch, tree)
        return batch

    def write_prepared(self, session: Session, batch: _Batch) -> None:
        """Write a prepared batch in the caller's transaction (which commits or rolls back)."""
        self._write(session, batch)
        self._count(batch)

    def _commit(self, batch: _Batch) -> None:
        with self.db.write() as session:
            self._write(session, batch)
        self._count(batch)
        self.report.batches += 1
        if self.progress is not None:
            self.progress(batch.root_runs)

    def _groups(self, trees: Iterable[ImportedRun]) -> Iterator[list[ImportedRun]]:
        pending: list[ImportedRun] = []
        size = 0
        for tree in trees:
            pending.append(tree)
            size += _tree_size(tree)
            if size >= self.batch_runs:
                yield pending
                pending, size = [], 0
        if pending:
            yield pending

    def _count(self, batch: _Batch) -> None:
        runs, events, messages, sessions = batch.tally()
        self.report.runs += runs
        self.report.events += events
        self.report.messages += messages
        self.report.sessions += sessions

    def run(self, trees: Iterable[ImportedRun]) -> ImportReport:
        """Write the trees' batches in order; a refused history stops the import before its
        batch is written (batches before it are committed)."""
        return self._run(self._groups(trees), self._prepare,
                         lambda group: (_prepare_in_worker, group, self._sessions_before(group)))

    def run_shares(self, shares: Iterable[HistoryShare]) -> ImportReport:
        """Write one batch per share, in order, each share built where its batch is prepared
        (in a worker process when there are workers): its trees never travel between
        processes. A refused share stops the import as a refused history does."""
        return self._run(iter(shares), lambda share: self._prepare(share()),
                         lambda share: (_prepare_share_in_worker, share))

    def _run(self, items: Iterator, prepare: Callable[[Any], _Batch],
             remote: Callable[[Any], tuple]) -> ImportReport:
        started = time.perf_counter()
        if self.workers:
            self._run_with_processes(items, remote)
        else:
            self._run_with_thread(_built(prepare, item) for item in items)
        self.report.seconds = time.perf_counter() - started
        return self.report

    def _run_with_thread(self, batches: Iterator[_Batch]) -> None:
        """Prepare batch n+1 in a helper thread while batch n is written."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bulk-import") as pool:
            upcoming = pool.submit(next, batches, None)
            while True:
                batch = upcoming.result()
                if batch is None:
                    break
                upcoming = pool.submit(next, batches, None)
                try:
                    self._commit(batch)
                except BaseException:
                    upcoming.cancel()
                    _drain(upcoming)
                    raise

    def _run_with_processes(self, items: Iterator, remote: Callable[[Any], tuple]) -> None:
        """Up to ``workers + 1`` batches are being prepared while one is written; ``remote``
        names the worker function and arguments of one item. A session (``ImportedSession``)
        is written by the first batch that uses it: for trees, this process, which sees the
        batches in order, tells each worker which of its sessions earlier batches wrote."""
        # spawn, not fork: this process holds open database connections and maybe threads
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_start_worker,
                                   initargs=(self.db.url, self.db.redactor.rules,
                                             self.minutes_from))
        upcoming: deque[Future] = deque()
        try:
            while True:
                while len(upcoming) <= self.workers:
                    item = next(items, None)
                    if item is None:
                        break
                    upcoming.append(pool.submit(*remote(item)))
                if not upcoming:
                    break
                self._commit(upcoming.popleft().result())
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _sessions_before(self, group: list[ImportedRun]) -> set[str]:
        """The ids of the group's new sessions that earlier groups already carry (and so
        write); the group's other new sessions are counted as written from now on."""
        earlier = set()
        for tree in group:
            if isinstance(tree.session, ImportedSession):
                if tree.session.id in self._sessions_written:
                    earlier.add(tree.session.id)
        for tree in group:
            if isinstance(tree.session, ImportedSession):
                self._sessions_written.add(tree.session.id)
        return earlier


# One importer per worker process, made by ``_start_worker``: it keeps the agent versions and
# existing sessions it has looked up, as the in-process importer does.
_worker_importer: BulkImporter | None = None


def _start_worker(url: str, rules: tuple, minutes_from: datetime) -> None:
    global _worker_importer
    _worker_importer = BulkImporter(Database(url, redaction_rules=rules),
                                    minutes_from=minutes_from)
    # A worker whose importer was killed would block for ever handing back a batch nobody
    # reads: it ends when the importing process does.
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True,
                         name="bulk-import-parent-watch").start()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


def _prepare_in_worker(group: list[ImportedRun], sessions_written: set[str]) -> _Batch:
    with collector_paused():
        return _worker_prepare(group, sessions_written)


def _prepare_share_in_worker(share: HistoryShare) -> _Batch:
    with collector_paused():  # the share's trees are part of the batch being built
        return _worker_prepare(share(), set())  # a share's new sessions are its own


def _worker_prepare(group: list[ImportedRun], sessions_written: set[str]) -> _Batch:
    importer = _worker_importer
    assert importer is not None, "the pool's initializer makes the importer"
    importer._sessions_written = sessions_written
    return importer._prepare(group)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a batch is built, as it was afterwards.

    Building a batch allocates a few hundred thousand objects that all stay alive until the
    batch is handed on, so the collector's automatic passes walk an ever larger heap and find
    nothing to free: measured on a demo history, a quarter of the time spent building (6 µs
    of 23 per event). The batch's objects hold no reference cycles (trees point down, rows
    are tuples), so reference counting frees them all once the batch is gone, and the
    collector runs again from then on. Paused around building only: in a worker process, whose
    one job that is, or in the helper thread of an import without workers.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _built(prepare: Callable[[Any], _Batch], item: Any) -> _Batch:
    with collector_paused():
        return prepare(item)


def _drain(future) -> None:
    """Let a preparation that already started finish (its error, if any, is not the story)."""
    try:
        future.result()
    except BaseException:  # noqa: BLE001, S110 - the write's own error is what is raised
        pass


def _check_children_told(where: str, run: ImportedRun, told: list[tuple[int, str, Any]]) -> None:
    """A parent's ``run.child_finished`` is the ledger's word that a child ended so: it must name
    one of the parent's children and the status that child's history ends in (an evidence bundle
    checks the same, so an imported history that said otherwise would never verify)."""
    children = {child.id: child for child in run.children}
    for seq, child_id, status in told:
        child = children.get(child_id)
        if child is None:
            raise ValidationFailed(f"{where} seq {seq}: run.child_finished names {child_id}, "
                                   "not a child of this run")
        ended = EVENT_TARGET.get(child.events[-1].type) if child.events else None
        if status != ended:
            raise ValidationFailed(f"{where} seq {seq}: run.child_finished says {child_id} ended "
                                   f"{status}, its history ends {ended}")


def _tree_size(run: ImportedRun) -> int:
    return 1 + sum(_tree_size(c) for c in run.children)


def bulk_import(db: Database, runs: Iterable[ImportedRun], *,
                batch_runs: int = DEFAULT_BATCH_RUNS,
                progress: Callable[[int], object] | None = None,
                workers: int = 0) -> ImportReport:
    """Import root runs (each with its child runs) in batches of about ``batch_runs`` runs.

    ``progress`` is called after each committed batch with the number of root runs it held.
    ``workers``: processes that prepare batches while this one writes (the trees are sent to
    them, so they must be picklable, as the dataclasses here are).
    A written session (``ImportedSession``) is remembered by this call only: pass its id as a
    string in later calls.
    """
    return BulkImporter(db, batch_runs=batch_runs, progress=progress,
                        workers=workers).run(runs)


def bulk_import_shares(db: Database, shares: Iterable[HistoryShare], *,
                       progress: Callable[[int], object] | None = None,
                       workers: int = 0) -> ImportReport:
    """Import a history given as shares, one batch per share (size them like ``batch_runs``),
    each built in the process that prepares its batch: with ``workers``, the trees never
    cross a process boundary (pickling them cost the writing process as much as writing).
    ``progress`` as for ``bulk_import``."""
    return BulkImporter(db, progress=progress, workers=workers).run_shares(shares)


def iter_runs(trees: Iterable[ImportedRun]) -> Iterator[ImportedRun]:
    """Every run of the trees, parents before children."""
    for tree in trees:
        yield tree
        yield from iter_runs(tree.children)


def _lease_time(run: ImportedRun, stated: object, where: str) -> datetime | None:
    """The lease a run.started granted: the import's own value, else the event's."""
    if run.lease_expires_at is not None:
        return _aware(run.lease_expires_at, where)
    if not isinstance(stated, str):
        return None
    try:
        return _aware(datetime.fromisoformat(stated), f"{where} run.started")
    except ValueError as exc:
        raise ValidationFailed(f"{where}: run.started lease_expires_at is not a time") from exc
