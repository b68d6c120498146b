"""The run state machine of the contract, as one table that every writer goes through.

``TRANSITIONS`` maps (from status, to status) to the one event type that performs the move.
``next_status`` is the only function that decides whether an event may be appended to a run in
a given status, and what status the run has afterwards; ``row_changes`` is the only one that says
what an event does to the run row besides its status and chain head (started_at, the lease,
finished_at, the final message, the error, the end reason). Appends, claims and the bulk import
all use both.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentledger.core.errors import (
    CancelRequested,
    IllegalTransition,
    RunTerminal,
    ValidationFailed,
)
from agentledger.core.vocabulary import ACTIVE, PROGRESS_EVENTS, TERMINAL

TRANSITIONS: dict[tuple[str, str], str] = {
    ("queued", "running"): "run.started",
    ("queued", "cancelled"): "run.cancelled",
    ("queued", "interrupted"): "run.interrupted",
    ("running", "succeeded"): "run.completed",
    ("running", "failed"): "run.failed",
    ("running", "cancelling"): "run.cancelling",
    ("running", "interrupted"): "run.interrupted",
    ("cancelling", "cancelled"): "run.cancelled",
    ("cancelling", "interrupted"): "run.interrupted",
}

# The status an event type moves a run to (derived from the table: each type has one target).
EVENT_TARGET: dict[str, str] = {event: to for (_, to), event in TRANSITIONS.items()}

# Events that report progress without moving the run; only a started, unfinished run has progress.
INFORMATIONAL = PROGRESS_EVENTS

EVENT_TYPES = frozenset({"run.queued", *EVENT_TARGET, *INFORMATIONAL})


@dataclass(frozen=True)
class Lease:
    """Who holds a run, and until when (set by ``run.started``, renewed by heartbeats)."""

    executor_instance_id: str
    expires_at: datetime | None  # None only in imported history that did not record it


def row_changes(
    event_type: str, data: dict[str, Any], at: datetime, *, lease: Lease | None = None
) -> dict[str, Any]:
    """The run-row columns that appending ``event_type`` (with its stored ``data``) at ``at``
    sets, besides ``status``, ``last_event_seq`` and ``last_event_hash``."""
    changes: dict[str, Any] = {}
    if event_type == "run.started":
        if lease is None:
            raise ValueError("run.started needs the lease it grants")
        changes.update(executor_instance_id=lease.executor_instance_id,
                       lease_expires_at=lease.expires_at, last_heartbeat_at=at, started_at=at)
    elif event_type == "run.completed":
        changes["final_message_id"] = data["final_message_id"]
    elif event_type == "run.failed":
        changes["error"] = data["error"]
    elif event_type == "run.interrupted":
        changes["end_reason"] = data["reason"]
    if EVENT_TARGET.get(event_type) in TERMINAL:
        changes["finished_at"] = at
    return changes


def next_status(current: str, event_type: str) -> str:
    """The run's status after appending ``event_type``; raises if the contract forbids it."""
    if current in TERMINAL:
        raise RunTerminal(f"the run is {current}; a terminal run never changes again")
    if event_type in INFORMATIONAL:
        if current in ACTIVE:
            return current
        raise IllegalTransition(f"{event_type} is only allowed while a run is running, not {current}")
    target = EVENT_TARGET.get(event_type)
    if target is None:
        raise IllegalTransition(f"{event_type} cannot be appended to an existing run")
    if (current, target) in TRANSITIONS:
        return target
    if current == "cancelling" and target in ("succeeded", "failed"):
        raise CancelRequested(
            f"the run is being cancelled; {event_type} is refused, only run.cancelled may end it"
        )
    raise IllegalTransition(f"{event_type} is not allowed when the run is {current}")


# Who may end a run interrupted (CONTRACT §2). The ledger does, with the reason it saw
# (lease_expired, parent_terminal, service_restart); an executor only with executor_shutdown,
# and never while the run is cancelling: its run.cancelled confirms the stop, or the reconciler
# ends the run when its lease runs out.
EXECUTOR_INTERRUPT_REASON = "executor_shutdown"


def executor_may_interrupt(current: str) -> bool:
    """Whether a run's executor may end it ``interrupted`` (``executor_shutdown``) now."""
    return current != "cancelling"


def check_executor_interrupt(current: str, data: dict[str, Any]) -> None:
    """Raise unless an executor may append ``run.interrupted`` with ``data`` to a run that is
    ``current``: ``ValidationFailed`` for a reason that is the ledger's, ``CancelRequested``
    while the run is being cancelled."""
    if data.get("reason") != EXECUTOR_INTERRUPT_REASON:
        raise ValidationFailed(f"run.interrupted from an executor: reason must be "
                               f"{EXECUTOR_INTERRUPT_REASON!r}; the other reasons are the "
                               "ledger's")
    if not executor_may_interrupt(current):
        raise CancelRequested("the run is being cancelled: an executor ends it with "
                              "run.cancelled, not run.interrupted")
