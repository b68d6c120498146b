"""Reconciliation: ending runs whose executor is gone, without ever running the model again.

Each ``interrupt_*`` function handles one run in the caller's transaction and re-checks its
condition under the row lock, so any number of reconcilers can run at once: the first one to
lock the row appends ``run.interrupted``, the others find nothing left to do.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from agentledger.core import dialect
from agentledger.core.schema import AgentRun
from agentledger.core.vocabulary import ACTIVE, NON_TERMINAL, TERMINAL
from ingest.events import append_events, lock_run_and_parent
from ingest.state_machine import EXECUTOR_INTERRUPT_REASON, executor_may_interrupt


def expired_lease_run_ids(session: Session, *, limit: int = 500) -> list[str]:
    """Active runs whose lease ended before the database's now, oldest expiry first."""
    now = dialect.now(session)
    return list(
        session.execute(
            select(AgentRun.id)
            .where(AgentRun.status.in_(ACTIVE), AgentRun.lease_expires_at < now)
            .order_by(AgentRun.lease_expires_at)
            .limit(limit)
        ).scalars()
    )


def interrupt_if_lease_expired(session: Session, run_id: str) -> bool:
    run = lock_run_and_parent(session, run_id)
    now = dialect.now(session)
    if run.status not in ACTIVE or run.lease_expires_at is None or run.lease_expires_at >= now:
        return False
    append_events(
        session,
        run_id,
        [("run.interrupted", {"reason": "lease_expired",
                              "executor_instance_id": run.executor_instance_id,
                              "lease_expires_at": run.lease_expires_at.isoformat()})],
        now=now,
    )
    return True


def orphaned_child_run_ids(session: Session, *, limit: int = 500) -> list[str]:
    """Queued child runs whose parent has already ended: nobody will wait for them."""
    parent = aliased(AgentRun)
    return list(
        session.execute(
            select(AgentRun.id)
            .join(parent, parent.id == AgentRun.parent_run_id)
            .where(AgentRun.status == "queued", parent.status.in_(TERMINAL))
            .order_by(AgentRun.created_at)
            .limit(limit)
        ).scalars()
    )


def interrupt_if_orphaned(session: Session, run_id: str) -> bool:
    run = lock_run_and_parent(session, run_id)
    if run.status != "queued" or run.parent_run_id is None:
        return False
    parent_status = session.execute(
        select(AgentRun.status).where(AgentRun.id == run.parent_run_id)
    ).scalar_one()
    if parent_status not in TERMINAL:
        return False
    append_events(
        session,
        run_id,
        [("run.interrupted", {"reason": "parent_terminal", "parent_run_id": run.parent_run_id,
                              "parent_status": parent_status})],
    )
    return True


def executor_run_ids(session: Session, executor_instance_id: str) -> list[str]:
    """The unfinished runs leased to this executor instance, oldest first."""
    return list(session.execute(
        select(AgentRun.id)
        .where(
            AgentRun.executor_instance_id == executor_instance_id,
            AgentRun.status.in_(NON_TERMINAL),
        )
        .order_by(AgentRun.created_at)
    ).scalars())


def executor_ids_holding_runs(session: Session, prefix: str) -> list[str]:
    """The executor instance ids beginning with ``prefix`` that hold unfinished runs."""
    found = session.execute(
        select(AgentRun.executor_instance_id).distinct()
        .where(AgentRun.status.in_(NON_TERMINAL),
               AgentRun.executor_instance_id.startswith(prefix, autoescape=True))
    ).scalars()
    return sorted(i for i in found if i is not None)


def interrupt_executor_run(session: Session, run_id: str, executor_instance_id: str, *,
                           reason: str) -> bool:
    """End one run of this executor instance ``interrupted`` with ``reason``, unless it ended
    or changed hands meanwhile."""
    run = lock_run_and_parent(session, run_id)
    if run.status in TERMINAL or run.executor_instance_id != executor_instance_id:
        return False
    if reason == EXECUTOR_INTERRUPT_REASON and not executor_may_interrupt(run.status):
        return False  # a stopping executor leaves a cancelling run to the reconciler
    append_events(
        session,
        run_id,
        [("run.interrupted", {"reason": reason, "executor_instance_id": executor_instance_id})],
    )
    return True


def interrupt_executor_runs(session: Session, executor_instance_id: str, *, reason: str) -> list[str]:
    """End every unfinished run leased to this executor instance (``service_restart`` when it
    starts again, ``executor_shutdown`` when it stops on purpose), all in the caller's
    transaction: for writers alone on the database (an import, demo data). A live executor ends
    them one transaction each (``worker.backends``): two instances ending their runs at once
    lock rows of trees they share, and one transaction each never waits for a row while holding
    another run's."""
    return [run_id for run_id in executor_run_ids(session, executor_instance_id)
            if interrupt_executor_run(session, run_id, executor_instance_id, reason=reason)]
