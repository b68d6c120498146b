"""The data each event type must carry (CONTRACT §3); extra keys are kept as given."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError

from agentledger.core.errors import ValidationFailed
from agentledger.core.hashing import storable_json
from agentledger.core.json_limits import MAX_ERROR_MESSAGE
from agentledger.core.vocabulary import InterruptReason


class _Data(BaseModel):
    model_config = ConfigDict(extra="allow")


class MessageDelta(_Data):
    text: str


class ToolCall(_Data):
    name: str = Field(min_length=1)
    input: Any
    # The framework's id of this call, repeated by its result (frameworks that have one).
    call_id: str | None = None


class ToolResult(_Data):
    name: str = Field(min_length=1)
    output: Any
    call_id: str | None = None


# Far above any model call, and low enough that a run's sums stay inside the columns that
# hold them: an absurd count accepted here would make the run's ending fail to store its totals,
# leaving the run unable to end.
MAX_TOKENS_PER_CALL = 10**12
MAX_COST_USD_PER_CALL = 1e12


class Usage(_Data):
    # Strict: the data is stored as sent, so ``"5"`` or ``true`` must be refused, not read as 5
    # or 1 (a strict float still takes an integer).
    input_tokens: StrictInt = Field(ge=0, le=MAX_TOKENS_PER_CALL)
    output_tokens: StrictInt = Field(ge=0, le=MAX_TOKENS_PER_CALL)
    # Always present (CONTRACT §3); null when no price is known: sums count it as unknown, never zero.
    cost_usd: StrictFloat | None = Field(ge=0, le=MAX_COST_USD_PER_CALL)
    model: str | None = None


class AgentResolved(_Data):
    """What a code-defined agent (kinds ``langgraph``, ``openai-agents``) actually loaded."""

    name: str
    model: str | None
    instructions_sha256: str | None
    tools: list[str]
    source: str = Field(min_length=3)
    package: str | None
    package_version: str | None
    content_hash: str | None


class AgentHandoff(_Data):
    from_agent: str
    to_agent: str


class ErrorInfo(BaseModel):
    code: str = Field(min_length=1, max_length=100)
    message: str = Field(max_length=MAX_ERROR_MESSAGE)


class RunFailedData(_Data):
    error: ErrorInfo


class RunCancelledData(_Data):
    external_stop_confirmed: Literal[True]


class RunInterruptedData(_Data):
    reason: InterruptReason


class RunCompletedData(_Data):
    # The executor may send the answer; otherwise it is the run's message.delta texts joined.
    content: str | None = None


class ChildFinished(_Data):
    child_run_id: str
    status: str


class StopRequested(_Data):
    requested_by: str


class Started(_Data):
    executor_instance_id: str


class _Any(_Data):
    pass


DATA_MODELS: dict[str, type[BaseModel]] = {
    "message.delta": MessageDelta,
    "tool.call": ToolCall,
    "tool.result": ToolResult,
    "usage": Usage,
    "agent.resolved": AgentResolved,
    "agent.handoff": AgentHandoff,
    "run.failed": RunFailedData,
    "run.cancelled": RunCancelledData,
    "run.interrupted": RunInterruptedData,
    "run.completed": RunCompletedData,
    "run.child_finished": ChildFinished,
    "run.cancelling": StopRequested,
    "run.started": Started,
    "run.child_created": _Any,
    "run.queued": _Any,
}
# Each model's own validator, called directly: every event is checked, and the Python wrapper
# of ``model_validate`` around it took as long again as the check of a short delta.
_VALIDATORS = {event_type: model.__pydantic_validator__ for event_type, model in DATA_MODELS.items()}

# Event types an external executor may append through the events route; the others are written
# by the ledger itself (creation, claim, cancel requests, delegation).
EXECUTOR_APPENDABLE = frozenset(
    {
        "message.delta",
        "tool.call",
        "tool.result",
        "usage",
        "agent.resolved",
        "agent.handoff",
        "run.completed",
        "run.failed",
        "run.cancelled",
        "run.interrupted",
    }
)


def validated_data(event_type: str, data: Any) -> dict:
    """The event's data after checking it against its type, as a new dict the caller may
    change (``storable_json`` builds it); raises ``ValidationFailed``."""
    validator = _VALIDATORS.get(event_type)
    if validator is None:
        raise ValidationFailed(f"unknown event type {event_type!r}")
    if not isinstance(data, dict):
        raise ValidationFailed(f"data of {event_type} must be an object")
    data = storable_json(data, f"{event_type} data")
    try:
        validator.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "data"
        raise ValidationFailed(f"{event_type} data.{where}: {first['msg']}") from exc
    if event_type == "run.cancelled" and not isinstance(data.get("external_stop_confirmed"), bool):
        raise ValidationFailed("run.cancelled data.external_stop_confirmed must be true")
    return data

