"""A lease that has run out, without waiting for it: ``expire_lease(db, run_id)``.

A test that claims with a one-second lease and sleeps past it fails on a busy machine whenever
its own steps "in time" take longer than that second. Such a test claims with a long lease
instead, does what must happen in time, then moves the lease's deadline into the past here, as
the project's race tests do (``_set_lease`` in ``tests/test_guarantees_races.py``): every lease
check (appends, heartbeats, the reconciler, the memory routes) compares that deadline with the
database's clock, so the run is then exactly as if nobody had renewed it in time.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from agentledger.core import dialect
from agentledger.core.database import Database
from agentledger.core.schema import AgentRun


def expire_lease(db: Database, run_id: str, *, ago: float = 1.0) -> None:
    """Move the lease of ``run_id`` (a run someone holds) to end ``ago`` seconds before the
    database's now."""
    with db.write() as s:
        held = s.execute(select(AgentRun.lease_expires_at).where(AgentRun.id == run_id)
                         ).scalar_one()
        assert held is not None, f"run {run_id} holds no lease"
        now = dialect.now(s)
        s.execute(update(AgentRun).where(AgentRun.id == run_id)
                  .values(lease_expires_at=now - timedelta(seconds=ago)))
