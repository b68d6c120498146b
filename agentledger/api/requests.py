"""Request bodies and query strings. Requests are validated with these models and the OpenAPI
document is generated from them, so the two can never drift apart."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from agentledger.core.config import (
    MAX_CLAIM,
    MAX_INSTANCE_ID_LENGTH,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
)
from agentledger.core.hashing import is_storable_text
from agentledger.core.vocabulary import InterruptReason, RunStatus

AGENT_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
MAX_CONTENT = 32_000
# A claim's longest wait for work: well inside the read timeouts of HTTP clients (this
# project's 30 s, often 10 s elsewhere) and the idle timeouts of proxies; each waiting claim
# holds one of the server's threads.
MAX_CLAIM_WAIT_SECONDS = 5
# Columns that hold an event seq or a version are INTEGER (int32) on both databases.
MAX_INT32 = 2_147_483_647


class Strict(BaseModel):
    # Unknown fields are refused: a body cannot smuggle in owner_id, status, seq, leases…
    model_config = ConfigDict(extra="forbid")


def _storable(value: str) -> str:
    if not is_storable_text(value):
        raise ValueError("must not contain NUL characters or lone surrogates")
    return value


StorableText = Annotated[str, AfterValidator(_storable)]
"""Text either database can store: no NUL, no lone surrogates (its JSON schema is a string)."""

_ISO_8601 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:\d{2})"
)


def _iso_8601_text(value: Any) -> Any:
    # pydantic alone also takes a bare number as a Unix time ("0.5"): only ISO 8601 text is a time.
    if not isinstance(value, str) or not _ISO_8601.fullmatch(value):
        raise ValueError("must be an ISO 8601 date-time with a UTC offset, e.g. 2026-01-31T12:00:00Z")
    return value


def _in_utc_range(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)  # the databases compare in UTC; year 1 at +14:00 has none
    except OverflowError:
        raise ValueError("is out of range") from None


IsoDateTime = Annotated[AwareDatetime, BeforeValidator(_iso_8601_text), AfterValidator(_in_utc_range)]
"""A date-time query parameter: ISO 8601 text with an offset, nothing else."""


# ---- requests -------------------------------------------------------------------------------


class AgentBody(Strict):
    id: str = Field(pattern=AGENT_ID_PATTERN, description="slug chosen by whoever registers it")
    name: StorableText = Field(min_length=1, max_length=200)
    kind: StorableText = Field(min_length=1, max_length=63)
    model: StorableText | None = Field(default=None, max_length=200)
    instructions: StorableText | None = Field(default=None, max_length=100_000)
    tools: list[Any] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)


class AgentVersionBody(AgentBody):
    id: str | None = Field(default=None, pattern=AGENT_ID_PATTERN, description="if given, must match the path")


class CreateSessionBody(Strict):
    agent_id: str = Field(pattern=AGENT_ID_PATTERN)
    title: StorableText | None = Field(default=None, max_length=500)


class PatchSessionBody(Strict):
    title: StorableText | None = Field(default=None, max_length=500)
    agent_id: str | None = Field(default=None, pattern=AGENT_ID_PATTERN)


class ContextItemBody(Strict):
    id: StorableText = Field(min_length=1, max_length=200)
    title: StorableText = Field(min_length=0, max_length=500)
    content: StorableText = Field(max_length=1_000_000)
    version: StorableText | int | None = None


class PostMessageBody(Strict):
    content: StorableText = Field(min_length=1, max_length=MAX_CONTENT)
    agent_id: str | None = Field(default=None, pattern=AGENT_ID_PATTERN)
    context: list[ContextItemBody] | None = Field(default=None, max_length=100)


class ListQuery(Strict):
    limit: int = Field(default=50, ge=1, le=500)
    cursor: str | None = Field(default=None, max_length=2000)


class RunListQuery(ListQuery):
    status: RunStatus | None = None
    agent_id: str | None = Field(default=None, max_length=63)
    session_id: str | None = Field(default=None, max_length=40)
    root_run_id: str | None = Field(default=None, max_length=40)
    created_after: IsoDateTime | None = None
    created_before: IsoDateTime | None = None


class AdminActionsQuery(ListQuery):
    action: Literal["token.created", "token.revoked", "agent.registered", "agent.versioned",
                    "run.cancel_requested", "session.deleted"] | None = None
    actor: str | None = Field(default=None, max_length=200)
    target_id: str | None = Field(default=None, max_length=200)
    since: IsoDateTime | None = None
    until: IsoDateTime | None = None


class EventsQuery(Strict):
    after_seq: int = Field(default=0, ge=0, le=MAX_INT32)
    limit: int = Field(default=50, ge=1, le=500)


class ClaimBody(Strict):
    executor_instance_id: StorableText = Field(min_length=1, max_length=MAX_INSTANCE_ID_LENGTH)
    max_runs: int = Field(default=1, ge=1, le=MAX_CLAIM)
    lease_seconds: float | None = Field(default=None, ge=MIN_LEASE_SECONDS, le=MAX_LEASE_SECONDS)
    wait_seconds: float = Field(
        default=0, ge=0, le=MAX_CLAIM_WAIT_SECONDS, strict=True,  # false is no number of seconds
        description="when no run is claimable, hold the answer up to this long until a run may "
                    "have become claimable, then answer with no runs (claim again then): a "
                    "waiting claim never takes a run, so a caller gone meanwhile loses none")


class HeartbeatBody(Strict):
    executor_instance_id: StorableText = Field(min_length=1, max_length=MAX_INSTANCE_ID_LENGTH)


class ExecutorEvent(Strict):
    type: StorableText = Field(min_length=1, max_length=40)
    data: dict[str, Any] = Field(default_factory=dict)


class AppendEventsBody(Strict):
    executor_instance_id: StorableText = Field(min_length=1, max_length=MAX_INSTANCE_ID_LENGTH)
    events: list[ExecutorEvent] = Field(min_length=1, max_length=1000)


class CreateChildBody(Strict):
    executor_instance_id: StorableText = Field(min_length=1, max_length=MAX_INSTANCE_ID_LENGTH)
    agent_id: str = Field(pattern=AGENT_ID_PATTERN)
    input: StorableText = Field(min_length=1, max_length=MAX_CONTENT)


# ---- a run's framework memory (agentledger.api.routes_memory) -----------------------------

CheckpointNs = Annotated[StorableText, Field(max_length=1000, description=(
    "LangGraph checkpoint namespace: empty for the graph, parent:task for a subgraph"))]
CheckpointId = Annotated[StorableText, Field(min_length=1, max_length=200)]


class MemoryCall(Strict):
    """Every memory route works on the thread of the run in its path, for the executor holding
    its lease; a body never names a thread."""

    executor_instance_id: StorableText = Field(min_length=1, max_length=MAX_INSTANCE_ID_LENGTH)


class TypedValue(Strict):
    """A value as LangGraph's serializer writes it (``dumps_typed``), the bytes in base64."""

    type: Literal["null", "bytes", "bytearray", "msgpack"]
    data: str = Field(max_length=16 * 1024 * 1024, description="base64")


class CheckpointGetBody(MemoryCall):
    checkpoint_ns: CheckpointNs = ""
    checkpoint_id: CheckpointId | None = Field(default=None, description="unset: the latest")


class CheckpointListBody(MemoryCall):
    checkpoint_ns: CheckpointNs | None = Field(default=None, description="unset: every namespace")
    checkpoint_id: CheckpointId | None = None
    before: CheckpointId | None = Field(default=None,
                                        description="only checkpoints older than this id")
    filter: dict[str, Any] | None = Field(default=None, description=(
        "metadata filter: keys of letters, digits, '_', '.' and '-'; text without NUL or lone "
        "surrogates, finite numbers"))
    limit: int = Field(default=100, ge=1, le=500)


class CheckpointPutBody(MemoryCall):
    checkpoint_ns: CheckpointNs = ""
    parent_checkpoint_id: CheckpointId | None = None
    checkpoint: TypedValue
    metadata: dict[str, Any] = Field(default_factory=dict, description=(
        "text without NUL or lone surrogates, finite numbers"))
    new_versions: dict[str, StorableText | int | float] = Field(default_factory=dict)


class PendingWriteBody(Strict):
    channel: StorableText = Field(min_length=1, max_length=1000)
    value: TypedValue


class CheckpointWritesBody(MemoryCall):
    checkpoint_ns: CheckpointNs = ""
    checkpoint_id: CheckpointId
    task_id: StorableText = Field(min_length=1, max_length=200)
    task_path: StorableText = Field(default="", max_length=2000)
    writes: list[PendingWriteBody] = Field(min_length=1, max_length=10_000)


class SessionItemsBody(MemoryCall):
    limit: int | None = Field(default=None, ge=0, le=MAX_INT32,
                              description="the latest this many items; unset: all")


class SessionAddBody(MemoryCall):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=10_000)


# ---- the JSON twins of the dashboards (CONTRACT §9) ---------------------------------------

WindowKey = Literal["1h", "6h", "24h", "7d", "14d", "30d", "90d", "all"]


def _window_year(value: datetime) -> datetime:
    # Window arithmetic (day and hour edges) must stay inside what a datetime can hold.
    if not 1900 <= value.year <= 9000:
        raise ValueError("must be a year between 1900 and 9000")
    return value


# A twin's time bound: strict ISO 8601 with an offset, in a year window arithmetic can hold.
WindowDateTime = Annotated[IsoDateTime, AfterValidator(_window_year)]


class CreatedWindow(Strict):
    """A preset ``window`` ending now (each twin defaults to its page's), or explicit bounds:
    ``created_after``/``created_before`` replace the preset when either is given."""

    window: WindowKey | None = None
    created_after: WindowDateTime | None = None
    created_before: WindowDateTime | None = None


class OverviewQuery(CreatedWindow):
    pass


class MessageSearchQuery(ListQuery, CreatedWindow):
    q: StorableText | None = Field(default=None, max_length=200,
                                   description="case-insensitive substring")
    session_id: str | None = Field(default=None, max_length=40)
    owner_id: StorableText | None = Field(default=None, max_length=200)
    agent_id: str | None = Field(default=None, max_length=63)


class TimelineQuery(ListQuery, CreatedWindow):
    status: RunStatus | None = None
    agent_id: str | None = Field(default=None, max_length=63)
    roots_only: bool = False


class InterruptedQuery(ListQuery):
    window: WindowKey | None = None
    interrupted_after: WindowDateTime | None = None
    interrupted_before: WindowDateTime | None = None
    reason: InterruptReason | None = None
    executor_instance_id: StorableText | None = Field(default=None, max_length=MAX_INSTANCE_ID_LENGTH)
    agent_id: str | None = Field(default=None, max_length=63)


class LeasesQuery(ListQuery):
    seen_minutes: int = Field(default=15, ge=1, le=1440,
                              description="executors seen within this many minutes")
    at_risk_seconds: int = Field(default=10, ge=1, le=3600,
                                 description="a lease with less time left is at risk")


class AgentOutcomesQuery(ListQuery, CreatedWindow):
    agent_id: str | None = Field(default=None, max_length=63)
