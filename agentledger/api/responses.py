"""Response bodies, as the OpenAPI document describes them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agentledger.core.vocabulary import RunStatus


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


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


class AgentList(BaseModel):
    items: list[AgentOut]
    next_cursor: str | None


class SessionOut(Open):
    id: str
    title: str | None
    agent_id: str
    owner_id: str
    created_at: str
    updated_at: str | None = None
    deleted_at: str | None = None


class SessionList(BaseModel):
    items: list[SessionOut]
    next_cursor: str | None


class MessageOut(Open):
    id: str
    role: Literal["user", "assistant"]
    content: str
    created_at: str
    run_id: str
    agent_id: str
    agent_name: str
    agent_version: int


class MessageList(BaseModel):
    items: list[MessageOut]
    next_cursor: str | None


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


class RunList(BaseModel):
    items: list[RunOut]
    next_cursor: str | None


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


class ClaimedRunOut(Open):
    run_id: str
    thread_id: str
    input: str
    agent_execution_snapshot: dict[str, Any]
    context_pack_snapshot: dict[str, Any]
    lease_expires_at: str


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


class AdminActionOut(BaseModel):
    id: str
    at: str
    actor: str
    actor_role: str
    action: str
    target_type: str
    target_id: str
    detail: dict[str, Any]


class AdminActionList(BaseModel):
    items: list[AdminActionOut]
    next_cursor: str | None


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
    cost_usd: float


class AgentOutcomesList(Open):
    items: list[OutcomeRow]
    next_cursor: str | None
    groups_truncated: bool
    percentiles_truncated: bool
    window: WindowOut
