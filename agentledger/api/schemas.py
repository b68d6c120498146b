"""Request and response bodies. Requests are validated with these models, and the OpenAPI
document is generated from them, so the two can never drift apart."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

AGENT_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
MAX_CONTENT = 32_000


class Strict(BaseModel):
    # Unknown fields are refused: a body cannot smuggle in owner_id, status, seq, leases…
    model_config = ConfigDict(extra="forbid")


def _no_nul(value: str | None) -> str | None:
    # Neither database stores NUL in text, and lone surrogates are not UTF-8.
    if value is not None and "\x00" in value:
        raise ValueError("must not contain NUL characters or lone surrogates")
    if value is not None and not value.isascii():
        try:
            value.encode("utf-8")  # fails exactly on lone surrogates (U+D800..U+DFFF)
        except UnicodeEncodeError:
            raise ValueError("must not contain NUL characters or lone surrogates") from None
    return value


# ---- requests -------------------------------------------------------------------------------


class AgentBody(Strict):
    id: str = Field(pattern=AGENT_ID_PATTERN, description="slug chosen by whoever registers it")
    name: str = Field(min_length=1, max_length=200)
    kind: str = Field(min_length=1, max_length=63)
    model: str | None = Field(default=None, max_length=200)
    instructions: str | None = Field(default=None, max_length=100_000)
    tools: list[Any] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)

    _nul = field_validator("name", "kind", "model", "instructions")(_no_nul)


class AgentVersionBody(AgentBody):
    id: str | None = Field(default=None, pattern=AGENT_ID_PATTERN, description="if given, must match the path")


class CreateSessionBody(Strict):
    agent_id: str = Field(pattern=AGENT_ID_PATTERN)
    title: str | None = Field(default=None, max_length=500)

    _nul = field_validator("title")(_no_nul)


class PatchSessionBody(Strict):
    title: str | None = Field(default=None, max_length=500)
    agent_id: str | None = Field(default=None, pattern=AGENT_ID_PATTERN)

    _nul = field_validator("title")(_no_nul)


class ContextItemBody(Strict):
    id: str = Field(min_length=1, max_length=200)
    title: str = Field(min_length=0, max_length=500)
    content: str = Field(max_length=1_000_000)
    version: str | int | None = None

    _nul = field_validator("id", "title", "content")(_no_nul)


class PostMessageBody(Strict):
    content: str = Field(min_length=1, max_length=MAX_CONTENT)
    agent_id: str | None = Field(default=None, pattern=AGENT_ID_PATTERN)
    context: list[ContextItemBody] | None = Field(default=None, max_length=100)

    _nul = field_validator("content")(_no_nul)


class ListQuery(Strict):
    model_config = ConfigDict(extra="ignore")
    limit: int = Field(default=50, ge=1, le=500)
    cursor: str | None = Field(default=None, max_length=2000)


RUN_STATUSES = Literal["queued", "running", "cancelling", "succeeded", "failed", "cancelled", "interrupted"]


class RunListQuery(ListQuery):
    status: RUN_STATUSES | None = None
    agent_id: str | None = Field(default=None, max_length=63)
    session_id: str | None = Field(default=None, max_length=40)
    root_run_id: str | None = Field(default=None, max_length=40)
    created_after: datetime | None = None
    created_before: datetime | None = None

    @field_validator("created_after", "created_before")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must include a UTC offset, e.g. 2026-01-31T12:00:00Z")
        return value


class AdminActionsQuery(ListQuery):
    action: Literal["token.created", "token.revoked", "agent.registered", "agent.versioned",
                    "run.cancel_requested", "session.deleted"] | None = None
    actor: str | None = Field(default=None, max_length=200)
    target_id: str | None = Field(default=None, max_length=200)
    since: datetime | None = None
    until: datetime | None = None

    @field_validator("since", "until")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must include a UTC offset, e.g. 2026-01-31T12:00:00Z")
        return value


class EventsQuery(Strict):
    model_config = ConfigDict(extra="ignore")
    after_seq: int = Field(default=0, ge=0)
    limit: int = Field(default=50, ge=1, le=500)


class ClaimBody(Strict):
    executor_instance_id: str = Field(min_length=1, max_length=200)
    max_runs: int = Field(default=1, ge=1, le=100)
    lease_seconds: float | None = Field(default=None, ge=1, le=3600)

    _nul = field_validator("executor_instance_id")(_no_nul)


class HeartbeatBody(Strict):
    executor_instance_id: str = Field(min_length=1, max_length=200)

    _nul = field_validator("executor_instance_id")(_no_nul)


class ExecutorEvent(Strict):
    type: str = Field(min_length=1, max_length=40)
    data: dict[str, Any] = Field(default_factory=dict)

    _nul = field_validator("type")(_no_nul)


class AppendEventsBody(Strict):
    executor_instance_id: str = Field(min_length=1, max_length=200)
    events: list[ExecutorEvent] = Field(min_length=1, max_length=1000)

    _nul = field_validator("executor_instance_id")(_no_nul)


class CreateChildBody(Strict):
    executor_instance_id: str = Field(min_length=1, max_length=200)
    agent_id: str = Field(pattern=AGENT_ID_PATTERN)
    input: str = Field(min_length=1, max_length=MAX_CONTENT)

    _nul = field_validator("input", "executor_instance_id")(_no_nul)


# ---- responses ------------------------------------------------------------------------------


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
    status: RUN_STATUSES
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
    status: RUN_STATUSES
    terminal: bool


class CancelOut(BaseModel):
    run_id: str
    status: RUN_STATUSES


class TreeNode(Open):
    run_id: str
    parent_run_id: str | None
    agent_id: str
    agent_name: str
    status: RUN_STATUSES
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
