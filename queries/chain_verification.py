"""Is every stored event exactly what the ledger wrote?

Recomputes each run's hash chain from its first event and compares it with the stored hashes,
the seq numbering (1, 2, 3… with no gap) and the run's recorded head (``last_event_seq``,
``last_event_hash``). Streams rows in ``(run_id, seq)`` order, so memory stays flat at any size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core.database import outside_transaction
from agentledger.core.hashing import GENESIS_HASH, event_hash
from agentledger.core.schema import AgentRun, RunEvent


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

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_chains(
    session: Session,
    *,
    run_id: str | None = None,
    progress: Callable[[int], None] | None = None,
    batch_size: int = 5000,
) -> VerificationReport:
    """Check every run (or one) and report the first broken seq of each damaged run.

    Checking every run streams the events through a server-side cursor, which on PostgreSQL
    needs a transaction: ``Database.read(transaction=True)``."""
    runs_stmt = select(AgentRun.id, AgentRun.last_event_seq, AgentRun.last_event_hash).order_by(
        AgentRun.id
    )
    events_stmt = select(
        RunEvent.run_id, RunEvent.seq, RunEvent.type, RunEvent.data, RunEvent.created_at, RunEvent.hash
    ).order_by(RunEvent.run_id, RunEvent.seq)
    if run_id is not None:
        runs_stmt = runs_stmt.where(AgentRun.id == run_id)
        events_stmt = events_stmt.where(RunEvent.run_id == run_id)

    heads = {r.id: (r.last_event_seq, r.last_event_hash) for r in session.execute(runs_stmt)}
    problems: list[ChainProblem] = []
    broken: set[str] = set()
    seen: dict[str, tuple[int, str]] = {}
    current, expected_seq, chain = None, 0, GENESIS_HASH
    events = 0

    def close(run: str | None) -> None:
        if run is not None:
            seen[run] = (expected_seq, chain)

    if run_id is not None:
        rows = session.execute(events_stmt)  # one run's events, read at once in any read
    elif outside_transaction(session):
        raise ValueError("checking every run streams its events through a server-side cursor: "
                         "read in a transaction (Database.read(transaction=True))")
    else:
        rows = session.execute(events_stmt.execution_options(yield_per=batch_size))
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
    close(current)

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
        if run_id is None:
            problems.append(ChainProblem(rid, 1, "events stored for a run that does not exist"))
    problems.sort(key=lambda p: (p.run_id, p.seq))
    return VerificationReport(runs_checked=len(heads), events_checked=events, problems=problems)
