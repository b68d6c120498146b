"""What does the ledger say right now, in the few numbers an operator alerts on?

Read at every ``/metrics`` scrape, so any server of a deployment answers for all of it, and
cheap at any size: unfinished runs and leases through the partial index on non-terminal runs,
finished runs per agent and status from the day rollup (a few rows per agent and day, never
``agent_run``), interruptions by reason through the ``(status, finished_at)`` index. Every
comparison uses the database clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agentledger.core.schema import AgentOutcomeRollup, AgentRun
from agentledger.core.vocabulary import INTERRUPT_REASONS, NON_TERMINAL
from queries.lease_health import DEFAULT_AT_RISK_SECONDS, LeaseCounts, lease_counts


@dataclass(frozen=True)
class LedgerFigures:
    runs_by_status: dict[str, int]  # every non-terminal status, 0 when none
    finished: dict[tuple[str, str], int]  # (agent_id, terminal status) → runs ever ended so
    queue_oldest_seconds: float  # 0 when nothing waits
    leases: LeaseCounts
    interrupted_by_reason: dict[str, int]  # every reason, 0 when none

    @property
    def reconcile_lag_seconds(self) -> float:
        oldest = self.leases.oldest_expired_lease_at
        return 0.0 if oldest is None else max(0.0, (self.leases.now - oldest).total_seconds())


def interrupted_by_reason(session: Session, *, finished_from: datetime | None = None,
                          finished_before: datetime | None = None) -> dict[str, int]:
    """Interrupted runs by reason, for those that ended in ``[finished_from, finished_before)``
    (a range on the ``(status, finished_at)`` index; the whole history when both are None)."""
    conditions = [AgentRun.status == "interrupted"]
    if finished_from is not None:
        conditions.append(AgentRun.finished_at >= finished_from)
    if finished_before is not None:
        conditions.append(AgentRun.finished_at < finished_before)
    reasons = dict.fromkeys(INTERRUPT_REASONS, 0)
    for reason, count in session.execute(
        select(AgentRun.end_reason, func.count()).where(*conditions).group_by(AgentRun.end_reason)
    ).all():
        if reason is not None:
            reasons[reason] = reasons.get(reason, 0) + int(count)
    return reasons


def ledger_figures(session: Session, *, at_risk_seconds: int = DEFAULT_AT_RISK_SECONDS,
                   interrupted: dict[str, int] | None = None) -> LedgerFigures:
    """``interrupted`` (by reason) when the caller keeps a running count; else counted here."""
    leases = lease_counts(session, at_risk_seconds=at_risk_seconds)
    by_status = dict.fromkeys(NON_TERMINAL, 0)
    oldest_queued = None
    # Grouped, so the planner reads the partial index on unfinished runs; a bare
    # min(created_at) WHERE status = 'queued' walks the created_at index instead, through
    # every run when nothing is queued.
    for status, count, oldest in session.execute(
        select(AgentRun.status, func.count(), func.min(AgentRun.created_at))
        .where(AgentRun.status.in_(NON_TERMINAL))
        .group_by(AgentRun.status)
    ).all():
        by_status[status] = int(count)
        if status == "queued":
            oldest_queued = oldest
    finished = {
        (agent_id, status): int(runs)
        for agent_id, status, runs in session.execute(
            select(AgentOutcomeRollup.agent_id, AgentOutcomeRollup.status,
                   func.sum(AgentOutcomeRollup.runs))
            .group_by(AgentOutcomeRollup.agent_id, AgentOutcomeRollup.status)
            .order_by(AgentOutcomeRollup.agent_id, AgentOutcomeRollup.status)
        ).all()
    }
    reasons = interrupted if interrupted is not None else interrupted_by_reason(session)
    wait = 0.0 if oldest_queued is None else max(0.0, (leases.now - oldest_queued).total_seconds())
    return LedgerFigures(by_status, finished, round(wait, 3), leases, reasons)
