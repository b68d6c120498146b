"""Request bodies and query strings. Requests are validated with these models and the OpenAPI
document is generated from them, so the two can never drift apart."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentledger.core.vocabulary import InterruptReason, RunStatus

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




class RunListQuery(ListQuery):
    status: RunStatus | None = None
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


# ---- the JSON twins of the dashboards (CONTRACT §9) ---------------------------------------

WindowKey = Literal["1h", "6h", "24h", "7d", "14d", "30d", "90d", "all"]


def _aware_or_none(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        raise ValueError("must include a UTC offset, e.g. 2026-01-31T12:00:00Z")
    # Window arithmetic (day and hour edges) must stay inside what a datetime can hold.
    if value is not None and not 1900 <= value.year <= 9000:
        raise ValueError("must be a year between 1900 and 9000")
    return value


class CreatedWindow(Strict):
    """A preset ``window`` ending now (each twin defaults to its page's), or explicit bounds:
    ``created_after``/``created_before`` replace the preset when either is given."""

    model_config = ConfigDict(extra="ignore")
    window: WindowKey | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None

    _aware = field_validator("created_after", "created_before")(_aware_or_none)


class OverviewQuery(CreatedWindow):
    pass


class MessageSearchQuery(ListQuery, CreatedWindow):
    q: str | None = Field(default=None, max_length=200, description="case-insensitive substring")
    session_id: str | None = Field(default=None, max_length=40)
    owner_id: str | None = Field(default=None, max_length=200)
    agent_id: str | None = Field(default=None, max_length=63)

    _nul = field_validator("q", "owner_id")(_no_nul)


class TimelineQuery(ListQuery, CreatedWindow):
    status: RunStatus | None = None
    agent_id: str | None = Field(default=None, max_length=63)
    roots_only: bool = False


class InterruptedQuery(ListQuery):
    window: WindowKey | None = None
    interrupted_after: datetime | None = None
    interrupted_before: datetime | None = None
    reason: InterruptReason | None = None
    executor_instance_id: str | None = Field(default=None, max_length=200)
    agent_id: str | None = Field(default=None, max_length=63)

    _aware = field_validator("interrupted_after", "interrupted_before")(_aware_or_none)
    _nul = field_validator("executor_instance_id")(_no_nul)


class LeasesQuery(ListQuery):
    seen_minutes: int = Field(default=15, ge=1, le=1440,
                              description="executors seen within this many minutes")
    at_risk_seconds: int = Field(default=10, ge=1, le=3600,
                                 description="a lease with less time left is at risk")


class AgentOutcomesQuery(ListQuery, CreatedWindow):
    agent_id: str | None = Field(default=None, max_length=63)
