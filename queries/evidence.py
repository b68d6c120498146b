"""What proves this answer? One self-contained evidence bundle of an assistant message.

The answer, its session, every run of the tree of the run that produced it (row, both
snapshots, every event with its stored hash and the previous hash of its chain), the chain heads
and the content of the context items the packs name. ``agentledger verify --bundle`` checks it
with nothing but the file (``agentledger.core.evidence_format``); the format is documented in
``docs/evidence.md``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

import agentledger
from agentledger.core.evidence_format import FORMAT, FORMAT_VERSION
from agentledger.core.hashing import GENESIS_HASH, timestamp_text
from agentledger.core.schema import AgentRun, ChatSession, ContextBlob, RunEvent
from queries.chain_verification import verify_chains
from queries.common import iso
from queries.provenance import UserMessage, message_provenance

# The run columns a bundle carries (everything but lease bookkeeping and idempotency hashes).
RUN_COLUMNS = (
    "id", "thread_id", "session_id", "root_run_id", "parent_run_id", "owner_id", "agent_id",
    "agent_version", "status", "input", "user_message_id", "agent_execution_snapshot",
    "context_pack_snapshot", "last_event_seq", "last_event_hash", "executor_instance_id",
    "final_message_id", "error", "created_at", "started_at", "finished_at",
)


def _run_row(run: AgentRun) -> dict[str, Any]:
    row = {}
    for column in RUN_COLUMNS:
        value = getattr(run, column)
        row[column] = iso(value) if isinstance(value, datetime) else value
    return row


def _tree_order(runs: list[AgentRun], root_id: str) -> list[AgentRun]:
    children: dict[str | None, list[AgentRun]] = {}
    for run in runs:
        children.setdefault(run.parent_run_id, []).append(run)
    ordered, frontier = [], [r for r in runs if r.id == root_id]
    while frontier:
        ordered.extend(frontier)
        frontier = [c for node in frontier for c in children.get(node.id, [])]
    return ordered


def evidence_bundle(
    session: Session, message_id: str, *, visible_to: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any] | None:
    """The bundle of one answer; None if the message is not visible to ``visible_to``.

    Raises ``queries.provenance.UserMessage`` for a user's message (only answers have one).
    """
    provenance = message_provenance(session, message_id, visible_to=visible_to)
    if provenance is None:
        return None
    message = provenance["message"]
    root_id = provenance["run"]["root_run_id"]
    runs = session.execute(
        select(AgentRun).where(AgentRun.root_run_id == root_id)
        .order_by(AgentRun.created_at, AgentRun.id)
    ).scalars().all()
    ordered = _tree_order(list(runs), root_id)
    run_ids = [r.id for r in ordered]

    events: dict[str, list[dict[str, Any]]] = {rid: [] for rid in run_ids}
    previous = dict.fromkeys(run_ids, GENESIS_HASH)
    for row in session.execute(
        select(RunEvent.run_id, RunEvent.seq, RunEvent.type, RunEvent.data, RunEvent.created_at,
               RunEvent.hash)
        .where(RunEvent.run_id.in_(run_ids)).order_by(RunEvent.run_id, RunEvent.seq)
    ):
        events[row.run_id].append({
            "seq": row.seq, "type": row.type, "data": row.data,
            # The exact text the hash covers, so the bundle can be checked by hand.
            "created_at": timestamp_text(row.created_at),
            "previous_hash": previous[row.run_id], "hash": row.hash,
        })
        previous[row.run_id] = row.hash

    digests = sorted({item["sha256"] for r in ordered
                      for item in r.context_pack_snapshot.get("items", [])})
    contents = {
        b.sha256: b.content for b in session.execute(
            select(ContextBlob).where(ContextBlob.sha256.in_(digests))).scalars()
    } if digests else {}

    chat = None
    if message["session_id"] is not None:
        found = session.execute(
            select(ChatSession.id, ChatSession.title, ChatSession.owner_id)
            .where(ChatSession.id == message["session_id"])
        ).one_or_none()
        if found is not None:
            chat = {"id": found.id, "title": found.title, "owner_id": found.owner_id}

    # What the ledger itself says of these chains at export time (the same check as
    # ``agentledger verify --run``); the bundle's own verification does not rely on it.
    ledger_problems = [
        {"run_id": p.run_id, "seq": p.seq, "problem": p.problem}
        for p in verify_chains(session, run_ids=run_ids).problems
    ]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "agentledger_version": agentledger.__version__,
        "generated_at": iso(now or datetime.now(UTC)),
        "message": message,
        "session": chat,
        "root_run_id": root_id,
        "runs": [{"run": _run_row(r), "events": events[r.id]} for r in ordered],
        "heads": {r.id: {"last_event_seq": r.last_event_seq, "last_event_hash": r.last_event_hash}
                  for r in ordered},
        "context_contents": contents,
        "ledger_check": {"ok": not ledger_problems, "problems": ledger_problems},
    }


__all__ = ["UserMessage", "evidence_bundle"]
