"""The run state machine of the contract, as one table that every writer goes through.

``TRANSITIONS`` maps (from status, to status) to the one event type that performs the move.
``next_status`` is the only function that decides whether an event may be appended to a run in
a given status, and what status the run has afterwards.
"""

from __future__ import annotations

from agentledger.core.errors import CancelRequested, IllegalTransition, RunTerminal
from agentledger.core.vocabulary import ACTIVE, NON_TERMINAL, PROGRESS_EVENTS, TERMINAL

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

STATUSES = (*NON_TERMINAL, *TERMINAL)
assert set(ACTIVE) <= set(NON_TERMINAL)




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
