"""What does the ledger say right now, in the few numbers an operator alerts on?

Read at every ``/metrics`` scrape, so any server of a deployment answers for all of it, and
cheap at any size: unfinished runs and leases through the partial index on non-terminal runs,
finished runs per agent and status from the day rollup (a few rows per agent and day, never
``agent_run``), interruptions by reason from their count per reason (kept in the transaction that
ends each interrupted run, and through archiving, like the day rollup). Every comparison uses the
database clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agentledger.core.schema import AgentOutcomeRollup, AgentRun, RunInterruptionCount
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


def interrupted_by_reason(session: Session) -> dict[str, int]:
    """Runs ever ended ``interrupted``, by reason: every reason, 0 when none. Read from
    ``run_interruption_count`` (a row per reason), which archiving never lowers."""
    reasons = dict.fromkeys(INTERRUPT_REASONS, 0)
    for reason, runs in session.execute(
        select(RunInterruptionCount.reason, RunInterruptionCount.runs)
        .order_by(RunInterruptionCount.reason)
    ).all():
        reasons[reason] = int(runs)
    return reasons


def ledger_figures(session: Session, *, at_risk_seconds: int = DEFAULT_AT_RISK_SECONDS
                   ) -> LedgerFigures:
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
    reasons = interrupted_by_reason(session)
    wait = 0.0 if oldest_queued is None else max(0.0, (leases.now - oldest_queued).total_seconds())
    return LedgerFigures(by_status, finished, round(wait, 3), leases, reasons)
