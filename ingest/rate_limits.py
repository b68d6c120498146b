"""Per-owner limits on run creation, counted in the database so every process shares them.

A fixed one-minute window per owner: the counter row is incremented in the transaction that
creates the run, so a refused request (which rolls back) is not counted and nothing of it is
written.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import delete
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from agentledger.core import dialect
from agentledger.core.errors import RateLimited
from agentledger.core.schema import RateLimitWindow

WINDOW = timedelta(minutes=1)


def take_run_slot(session: Session, owner_id: str, per_minute: int, *,
                  now: datetime | None = None) -> None:
    """Count one run for ``owner_id``; ``RateLimited`` (with ``Retry-After``) past the limit.

    ``now`` is the operation's clock when the caller has read it already."""
    if per_minute <= 0:
        return
    now = now or dialect.now(session)
    window = now.replace(second=0, microsecond=0)
    count = dialect.increment_counter(
        session, RateLimitWindow.__table__, {"owner_id": owner_id, "window_start": window}, "count"
    )
    if count > per_minute:
        retry_after = max(1, math.ceil((window + WINDOW - now).total_seconds()))
        raise RateLimited(
            f"more than {per_minute} runs a minute for {owner_id}; retry in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )


def prune_windows(session: Session, *, before: datetime | None = None) -> int:
    """Forget windows that ended more than ten minutes ago."""
    cutoff = before or dialect.now(session) - 10 * WINDOW
    return cast(CursorResult, session.execute(
        delete(RateLimitWindow).where(RateLimitWindow.window_start < cutoff)
    )).rowcount
