"""Historical import: replaying past activity through the real write path.

``replay_at(session, moment)`` makes every ingest function in that transaction stamp its rows
and events with ``moment`` instead of the database clock, so imported history goes through the
same state machine, hash chain and snapshots as live traffic. Used by ``agentledger demo seed``
and by importers of another system's history; never by live request handling.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session


def replay_at(session: Session, moment: datetime) -> None:
    if moment.tzinfo is None:
        raise ValueError("replay_at needs a timezone-aware moment")
    session.info["clock"] = moment.astimezone(UTC)

