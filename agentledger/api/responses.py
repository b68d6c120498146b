"""Response bodies, as the OpenAPI document describes them."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from agentledger.core.vocabulary import RunStatus


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a list (CONTRACT §5): its items and the cursor of the next page, if any.
    Each list names its page (``class RunList(Page[RunOut])``), so the OpenAPI document keeps
    one readable component per list."""

    items: list[T]
    next_cursor: str | None


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok"]
    database: Literal["sqlite", "postgresql"]


class AgentVersionOut(Open):
    version: int
    name: str
    kind: str
    model: str | None
    instructions: str | None
    tools: list[Any]
    params: dict[str, Any]
    content_hash: str
    created_at: str


class AgentOut(AgentVersionOut):
    id: str
    updated_at: str
    versions: list[AgentVersionOut] | None = None


class AgentList(Page[AgentOut]):
    pass


class SessionOut(Open):
    id: str
    title: str | None
    agent_id: str
    owner_id: str
    created_at: str
    updated_at: str | None = None
    deleted_at: str | None = None


class SessionList(Page[SessionOut]):
    pass


class MessageOut(Open):
    id: str
    role: Literal["user", "assistant"]
    content: str
    created_at: str
    run_id: str
    agent_id: str
    agent_name: str
    agent_version: int


class MessageList(Page[MessageOut]):
    pass


class PostMessageOut(BaseModel):
    message_id: str
    run_id: str
    events_url: str
    agent_id: str
    agent_name: str


class RunOut(Open):
    id: str
    session_id: str | None
    thread_id: str
    root_run_id: str
    parent_run_id: str | None
    owner_id: str
    agent_id: str
    agent_name: str
    agent_version: int
    status: RunStatus
    agent_execution_snapshot: dict[str, Any]
    context_pack_snapshot: dict[str, Any]
    last_event_seq: int
    executor_instance_id: str | None
    lease_expires_at: str | None
    final_message_id: str | None
    error: dict[str, Any] | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    events_url: str
    redaction_count: int | None = Field(
        None, description="admins only, in the run detail: values AGENTLEDGER_REDACT replaced "
                          "in this run's input, context, events and answer before storing")


class RunList(Page[RunOut]):
    pass


class EventOut(BaseModel):
    seq: int
    type: str
    data: dict[str, Any]
    created_at: str


class EventsOut(BaseModel):
    run_id: str
    events: list[EventOut]
    next_after_seq: int
    status: RunStatus
    terminal: bool


class CancelOut(BaseModel):
    run_id: str
    status: RunStatus


class TreeNode(Open):
    run_id: str
    parent_run_id: str | None
    agent_id: str
    agent_name: str
    status: RunStatus
    events_url: str
    created_at: str
    started_at: str | None
    finished_at: str | None


class TreeOut(BaseModel):
    root_run_id: str
    nodes: list[TreeNode]


class ProvenanceAgent(BaseModel):
    id: str
    name: str
    version: int


class ProvenanceOut(BaseModel):
    message: dict[str, Any]
    run: RunOut
    agent: ProvenanceAgent
    agent_execution_snapshot: dict[str, Any]
    context_pack_snapshot: dict[str, Any]
    session: SessionOut | None
    # The producing run's memory: {"role", "content", "run_id", "created_at", "message_id"}.
    history: list[dict[str, Any]]


class EvidenceOut(Open):
    """An evidence bundle (docs/evidence.md); served as an attachment."""

    format: str
    format_version: int
    agentledger_version: str
    generated_at: str
    message: dict[str, Any]
    session: dict[str, Any] | None
    root_run_id: str
    runs: list[dict[str, Any]]
    heads: dict[str, Any]


class ClaimedRunOut(Open):
    run_id: str
    thread_id: str
    input: str
    agent_execution_snapshot: dict[str, Any]
    context_pack_snapshot: dict[str, Any]
    lease_expires_at: str
    # The thread's earlier turns, oldest first: {"role", "content", "run_id", "created_at"}.
    history: list[dict[str, Any]]


class ClaimOut(BaseModel):
    runs: list[ClaimedRunOut]


class HeartbeatOut(BaseModel):
    lease_expires_at: str
    cancel_requested: bool


class AppendEventsOut(BaseModel):
    seqs: list[int]
    cancel_requested: bool


class ChildOut(BaseModel):
    run_id: str
    events_url: str


class TypedValueOut(BaseModel):
    type: str
    data: str


class PendingWriteOut(BaseModel):
    task_id: str
    channel: str
    value: TypedValueOut


class CheckpointTupleOut(BaseModel):
    """A LangGraph ``CheckpointTuple``: its configs and metadata as the saver keeps them, the
    checkpoint and each pending write's value as LangGraph's serializer writes them."""

    config: dict[str, Any]
    checkpoint: TypedValueOut
    metadata: dict[str, Any]
    parent_config: dict[str, Any] | None
    pending_writes: list[PendingWriteOut]


class CheckpointOut(BaseModel):
    checkpoint: CheckpointTupleOut | None


class CheckpointListOut(BaseModel):
    checkpoints: list[CheckpointTupleOut]


class CheckpointPutOut(BaseModel):
    config: dict[str, Any]


class WritesOut(BaseModel):
    written: int


class SessionItemsOut(BaseModel):
    items: list[Any]


class SessionItemOut(BaseModel):
    item: Any


class SessionAddedOut(BaseModel):
    added: int


class SessionClearedOut(BaseModel):
    cleared: bool


class AdminActionOut(BaseModel):
    id: str
    at: str
    actor: str
    actor_role: str
    action: str
    target_type: str
    target_id: str
    detail: dict[str, Any]


class AdminActionList(Page[AdminActionOut]):
    pass


class OtlpPartialSuccess(BaseModel):
    rejectedSpans: int | str = 0  # noqa: N815 - OTLP JSON field names (int64 may come as text)
    errorMessage: str = ""  # noqa: N815


class OtlpExportResponse(BaseModel):
    """``ExportTraceServiceResponse`` in OTLP JSON; protobuf clients get the same message encoded
    as ``application/x-protobuf``."""

    partialSuccess: OtlpPartialSuccess | None = None  # noqa: N815


# ---- the JSON twins of the dashboards -------------------------------------------------------


class WindowOut(BaseModel):
    start: str | None
    end: str | None


class OverviewOut(Open):
    now: str
    window: WindowOut
    bucket_seconds: int
    status_buckets: list[dict[str, Any]]
    buckets_truncated: bool
    totals: dict[str, int]
    unfinished_runs: list[dict[str, Any]]
    unfinished_truncated: bool
    recent_interruptions: list[dict[str, Any]]
    leases: dict[str, Any]


class MessageHit(Open):
    id: str
    content_preview: str
    content_truncated: bool
    created_at: str
    session_id: str | None
    owner_id: str
    run_id: str
    run_status: RunStatus
    agent_id: str
    agent_name: str | None
    agent_version: int | None


class MessageSearchList(BaseModel):
    items: list[MessageHit]
    next_cursor: str | None


class TimelineRow(Open):
    run_id: str
    status: RunStatus
    created_at: str
    queued_seconds: float | None
    running_seconds: float | None


class TimelineList(Open):
    items: list[TimelineRow]
    next_cursor: str | None
    total: int
    now: str
    window: WindowOut


class InterruptedRow(Open):
    run_id: str
    reason: str | None
    interrupted_at: str | None


class InterruptionTrendOut(BaseModel):
    bucket_seconds: int
    rows: list[dict[str, Any]]
    by_reason: dict[str, int]
    truncated: bool


class InterruptedList(Open):
    items: list[InterruptedRow]
    next_cursor: str | None
    trend: InterruptionTrendOut
    window: WindowOut


class LeaseRow(Open):
    run_id: str
    status: RunStatus
    executor_instance_id: str | None
    lease_expires_at: str | None
    seconds_left: float | None
    expired: bool
    at_risk: bool


class LeaseHealthOut(Open):
    items: list[LeaseRow]
    next_cursor: str | None
    now: str
    executors: list[dict[str, Any]]
    queued: int
    live_leases: int
    at_risk: int
    expired_unreconciled: int
    reconcile_lag_seconds: float


class OutcomeRow(Open):
    agent_id: str
    version: int | None
    name: str | None
    runs: int
    by_status: dict[str, int]
    latency_p50: float | None
    latency_p95: float | None
    latency_p99: float | None
    input_tokens: int
    output_tokens: int
    cost_usd: float | None  # null when no run of the group had a price
    runs_without_cost: int


class AgentOutcomesList(Open):
    items: list[OutcomeRow]
    next_cursor: str | None
    groups_truncated: bool
    window: WindowOut
