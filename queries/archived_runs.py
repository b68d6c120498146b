"""Which chain heads did the ledger record for runs it archived (to check an archive file)?"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core.schema import ArchivedRun


def archived_heads(session: Session, run_ids: list[str]) -> dict[str, tuple[int, str]] | None:
    """{run id: (last_event_seq, last_event_hash)} as recorded when each run was archived;
    None when this database archived nothing (the file is then checked on its own)."""
    if session.execute(select(ArchivedRun.run_id).limit(1)).first() is None:
        return None
    heads: dict[str, tuple[int, str]] = {}
    for start in range(0, len(run_ids), 1000):
        for row in session.execute(
            select(ArchivedRun.run_id, ArchivedRun.last_event_seq, ArchivedRun.last_event_hash)
            .where(ArchivedRun.run_id.in_(run_ids[start:start + 1000]))
        ):
            heads[row.run_id] = (row.last_event_seq, row.last_event_hash)
    return heads
