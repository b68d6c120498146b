"""Is every stored event exactly what the ledger wrote?

Recomputes each run's hash chain from its first event and compares it with the stored hashes,
the seq numbering (1, 2, 3… with no gap) and the run's recorded head (``last_event_seq``,
``last_event_hash``). Then what lives outside the chain against the digests the chain recorded
of it: each answer's stored text (its ``message`` row) against its run's ``run.completed``
(``content_sha256``), and each run's input and frozen snapshots (its row) against its
``run.queued`` (``input_sha256``, ``agent_snapshot_sha256``, ``context_pack_sha256``). Runs
recorded before the ledger wrote a digest are checked without it. Streams rows in
``(run_id, seq)`` order, so memory stays flat at any size.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core.database import outside_transaction
from agentledger.core.evidence_format import answer_gap, gap_notes, queued_gaps
from agentledger.core.hashing import GENESIS_HASH, event_hash, sha256_hex, snapshot_sha256
from agentledger.core.schema import AgentRun, Message, RunEvent

# Bound parameters per IN list: far below SQLite's limit of 32,766 variables.
CHOSEN_PER_STATEMENT = 500


@dataclass(frozen=True)
class ChainProblem:
    run_id: str
    seq: int
    problem: str


@dataclass(frozen=True)
class VerificationReport:
    runs_checked: int
    events_checked: int
    problems: list[ChainProblem]
    # What the chains of runs recorded before the ledger wrote a digest cannot prove
    # (``evidence_format.gap_notes``).
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_chains(
    session: Session,
    *,
    run_id: str | None = None,
    run_ids: Iterable[str] | None = None,
    progress: Callable[[int], None] | None = None,
    batch_size: int = 5000,
) -> VerificationReport:
    """Check every run (or one, or a chosen few) and report the first broken seq of each
    damaged run.

    Checking every run streams the events through a server-side cursor, which on PostgreSQL
    needs a transaction: ``Database.read(transaction=True)``. A chosen set is read with one
    statement per ``CHOSEN_PER_STATEMENT`` runs, in any read."""
    if run_id is not None and run_ids is not None:
        raise ValueError("give run_id or run_ids, not both")
    chosen = None if run_id is None and run_ids is None else \
        sorted({run_id} if run_id is not None else set(run_ids or ()))
    runs_stmt = select(AgentRun.id, AgentRun.last_event_seq, AgentRun.last_event_hash).order_by(
        AgentRun.id
    )
    events_stmt = select(
        RunEvent.run_id, RunEvent.seq, RunEvent.type, RunEvent.data, RunEvent.created_at, RunEvent.hash
    ).order_by(RunEvent.run_id, RunEvent.seq)

    if chosen is not None:
        # Each run's events come whole from one statement, in seq order: all the loop needs.
        chunks = [chosen[i:i + CHOSEN_PER_STATEMENT] for i in range(0, len(chosen), CHOSEN_PER_STATEMENT)]
        heads = {r.id: (r.last_event_seq, r.last_event_hash) for chunk in chunks
                 for r in session.execute(runs_stmt.where(AgentRun.id.in_(chunk)))}
        rows: Iterable = itertools.chain.from_iterable(
            session.execute(events_stmt.where(RunEvent.run_id.in_(chunk))) for chunk in chunks)
    elif outside_transaction(session):
        raise ValueError("checking every run streams its events through a server-side cursor: "
                         "read in a transaction (Database.read(transaction=True))")
    else:
        heads = {r.id: (r.last_event_seq, r.last_event_hash) for r in session.execute(runs_stmt)}
        rows = session.execute(events_stmt.execution_options(yield_per=batch_size))
    problems: list[ChainProblem] = []
    broken: set[str] = set()
    seen: dict[str, tuple[int, str]] = {}
    current, expected_seq, chain = None, 0, GENESIS_HASH
    events = 0
    gaps: Counter[str] = Counter()

    def close(run: str | None) -> None:
        if run is not None:
            seen[run] = (expected_seq, chain)

    answers = _DigestCheck(session, problems, Message.id, "answer {key} is missing", [
        (Message.content, sha256_hex, "answer {key}'s text is not the text its run recorded")])
    queued = _DigestCheck(session, problems, AgentRun.id, "run {key} is missing", [
        (AgentRun.input, sha256_hex, "the run's input is not the text its run.queued recorded"),
        (AgentRun.agent_execution_snapshot, snapshot_sha256,
         "the run's agent_execution_snapshot is not the snapshot its run.queued recorded"),
        (AgentRun.context_pack_snapshot, snapshot_sha256,
         "the run's context_pack_snapshot is not the snapshot its run.queued recorded")])
    for row in rows:
        events += 1
        if progress and events % batch_size == 0:
            progress(events)
        if row.run_id != current:
            close(current)
            current, expected_seq, chain = row.run_id, 0, GENESIS_HASH
        if row.run_id in broken:
            continue
        expected_seq += 1
        if row.seq != expected_seq:
            problems.append(ChainProblem(row.run_id, expected_seq, f"event seq {expected_seq} is missing"))
            broken.add(row.run_id)
            continue
        chain = event_hash(chain, row.run_id, row.seq, row.type, row.data, row.created_at)
        if chain != row.hash:
            problems.append(ChainProblem(row.run_id, row.seq, "stored hash does not match the event's content"))
            broken.add(row.run_id)
        elif row.type == "run.completed":
            answers.add(row.data.get("final_message_id"), row.run_id, row.seq,
                        (row.data.get("content_sha256"),))
            gaps.update(("answer",) if answer_gap(row.data) else ())
        elif row.seq == 1:
            queued.add(row.run_id, row.run_id, 1, (
                row.data.get("input_sha256"), row.data.get("agent_snapshot_sha256"),
                row.data.get("context_pack_sha256")))
            gaps.update(queued_gaps(row.data))
    close(current)
    answers.check()
    queued.check()

    for rid, (last_seq, last_hash) in heads.items():
        if rid in broken:
            continue
        got_seq, got_hash = seen.get(rid, (0, GENESIS_HASH))
        if got_seq != last_seq:
            missing = min(got_seq, last_seq) + 1 if got_seq < last_seq else last_seq + 1
            problems.append(
                ChainProblem(rid, missing, f"run records {last_seq} events but {got_seq} are stored")
            )
        elif got_hash != last_hash:
            problems.append(ChainProblem(rid, last_seq, "chain head does not match the run's record"))
    orphans = set(seen) - set(heads)
    for rid in sorted(orphans):
        if chosen is None:
            problems.append(ChainProblem(rid, 1, "events stored for a run that does not exist"))
    problems.sort(key=lambda p: (p.run_id, p.seq))
    return VerificationReport(runs_checked=len(heads), events_checked=events, problems=problems,
                              notes=gap_notes(gaps, one_answer=False,
                                                             snapshots_self_checked=False))


class _DigestCheck:
    """Values kept outside the chain (an answer's text in its ``message`` row; a run's input
    and snapshots in its run row) against the digests their events recorded, looked up
    ``CHOSEN_PER_STATEMENT`` rows at a time, so the check holds a bounded number of them.

    ``fields``: (column, digest of its value, problem) for each digest an event records, in the
    order ``add`` is given them."""

    def __init__(self, session: Session, problems: list[ChainProblem], key, missing: str,
                 fields: list[tuple[Any, Callable[[Any], str], str]]):
        self.session, self.problems = session, problems
        self.key, self.missing, self.fields = key, missing, fields
        self.waiting: dict[str, tuple[str, int, tuple[str | None, ...]]] = {}

    def add(self, key: str | None, run_id: str, seq: int,
            recorded: tuple[str | None, ...]) -> None:
        # A digest None: recorded before the ledger kept it (that value is not checked).
        if key is None or all(digest is None for digest in recorded):
            return
        self.waiting[key] = (run_id, seq, recorded)
        if len(self.waiting) >= CHOSEN_PER_STATEMENT:
            self.check()

    def check(self) -> None:
        if not self.waiting:
            return
        stored = {row[0]: row[1:] for row in self.session.execute(
            select(self.key, *(column for column, _, _ in self.fields))
            .where(self.key.in_(list(self.waiting))))}
        for key, (run_id, seq, recorded) in self.waiting.items():
            values = stored.get(key)
            if values is None:
                self.problems.append(ChainProblem(run_id, seq, self.missing.format(key=key)))
                continue
            for (_, digest, differs), value, wanted in zip(self.fields, values, recorded,
                                                           strict=True):
                if wanted is not None and (value is None or digest(value) != wanted):
                    self.problems.append(ChainProblem(run_id, seq, differs.format(key=key)))
        self.waiting = {}
