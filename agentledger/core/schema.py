"""The tables, as SQLAlchemy 2 typed models.

Only ``ingest`` writes these rows; ``queries`` reads them with Core selects and returns plain
data. The Alembic migrations under ``agentledger/migrations`` create exactly this schema (a test
compares them) plus the triggers that make ``run_event`` append-only and run snapshots frozen.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from agentledger.core.event_partitions import is_event_partition
from agentledger.core.outcome_histogram import LATENCY_COLUMNS, WAIT_COLUMNS


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on both databases.

    PostgreSQL stores ``timestamptz``; SQLite has no time type, so values are stored as naive
    UTC ISO strings, which also sort and compare correctly as text.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# JSONB on PostgreSQL: it has equality (the snapshot trigger compares values) and indexes.
JSONDoc = JSON().with_variant(JSONB(), "postgresql")

_non_terminal_sql = "status IN ('queued', 'running', 'cancelling')"
_active_sql = "status IN ('running', 'cancelling')"

naming = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def exists_on(obj, dialect_name: str) -> bool:
    """False for schema objects declared for other dialects only (``.ddl_if(dialect=…)``) and
    for ``run_event``'s partitions (the layout, not tables of the model); Alembic's comparison
    uses it as ``include_object``."""
    if isinstance(obj, Table) and is_event_partition(obj.name):
        return False
    condition = getattr(obj, "_ddl_if", None)
    if condition is None or condition.dialect is None:
        return True
    wanted = condition.dialect
    return dialect_name == wanted if isinstance(wanted, str) else dialect_name in wanted


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=naming)
    if TYPE_CHECKING:  # every model maps one Table (SQLAlchemy types it as any FromClause)
        __table__: ClassVar[Table]


class Agent(Base):
    __tablename__ = "agent"

    id: Mapped[str] = mapped_column(String(63), primary_key=True)
    latest_version: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class AgentVersion(Base):
    """One immutable definition of an agent; a PUT adds a row, nothing updates one."""

    __tablename__ = "agent_version"

    agent_id: Mapped[str] = mapped_column(ForeignKey("agent.id"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    kind: Mapped[str] = mapped_column(String(63), nullable=False)
    model: Mapped[str | None] = mapped_column(String(200))
    instructions: Mapped[str | None] = mapped_column(Text)
    tools: Mapped[Any] = mapped_column(JSONDoc, nullable=False)
    params: Mapped[Any] = mapped_column(JSONDoc, nullable=False)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class ConversationThread(Base):
    """Where a model's continuous memory lives. Backend only: never sent to clients as input."""

    __tablename__ = "conversation_thread"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(200), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class ChatSession(Base):
    __tablename__ = "chat_session"
    __table_args__ = (Index(None, "owner_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(200), nullable=False)
    title: Mapped[str | None] = mapped_column(String(500))
    agent_id: Mapped[str] = mapped_column(ForeignKey("agent.id"), nullable=False)
    thread_id: Mapped[str] = mapped_column(
        ForeignKey("conversation_thread.id"), nullable=False, unique=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class AgentRun(Base):
    __tablename__ = "agent_run"
    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key_hash"),
        Index(None, "root_run_id"),
        Index(None, "parent_run_id"),
        Index(None, "session_id"),
        Index(None, "agent_id", "created_at"),
        Index(None, "created_at"),
        Index(None, "thread_id", "created_at"),
        Index(None, "status", "finished_at"),
        # Interrupted runs by when they were interrupted, with what the interruption reads
        # count and filter by: the trend per day and reason is an index-only scan on
        # PostgreSQL instead of a visit to every interrupted run's row.
        Index(
            "ix_agent_run_interrupted",
            "finished_at",
            postgresql_include=["end_reason", "agent_id", "executor_instance_id"],
            sqlite_where=text("status = 'interrupted'"),
            postgresql_where=text("status = 'interrupted'"),
        ),
        Index(
            "ix_agent_run_live_lease",
            "status",
            "lease_expires_at",
            sqlite_where=text(_non_terminal_sql),
            postgresql_where=text(_non_terminal_sql),
        ),
        # The database itself guarantees one running/cancelling run per thread.
        Index(
            "uq_agent_run_one_active_per_thread",
            "thread_id",
            unique=True,
            sqlite_where=text(_active_sql),
            postgresql_where=text(_active_sql),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    thread_id: Mapped[str] = mapped_column(ForeignKey("conversation_thread.id"), nullable=False)
    session_id: Mapped[str | None] = mapped_column(ForeignKey("chat_session.id"))
    root_run_id: Mapped[str] = mapped_column(String(40), nullable=False)
    parent_run_id: Mapped[str | None] = mapped_column(ForeignKey("agent_run.id"))
    owner_id: Mapped[str] = mapped_column(String(200), nullable=False)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agent.id"), nullable=False)
    agent_version: Mapped[int] = mapped_column(Integer, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    agent_execution_snapshot: Mapped[Any] = mapped_column(JSONDoc, nullable=False)
    context_pack_snapshot: Mapped[Any] = mapped_column(JSONDoc, nullable=False)
    input: Mapped[str] = mapped_column(Text, nullable=False)
    user_message_id: Mapped[str | None] = mapped_column(String(40))
    last_event_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    last_event_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    executor_instance_id: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    idempotency_key_hash: Mapped[str | None] = mapped_column(String(64))
    request_checksum: Mapped[str | None] = mapped_column(String(64))
    final_message_id: Mapped[str | None] = mapped_column(String(40))
    error: Mapped[Any | None] = mapped_column(JSONDoc)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The reason of an interrupted run's ``run.interrupted`` event, copied when it is appended:
    # the interruption reads group thousands of runs by reason, and joining each to its last
    # event cost ~0.5 s at 1.4M runs. NULL for every other status. Not part of the API's run.
    end_reason: Mapped[str | None] = mapped_column(String(40))
    # How many values ``AGENTLEDGER_REDACT`` replaced in this run's input, context, events and
    # answer before they were stored. Admins only (the run detail shows it to them).
    redaction_count: Mapped[int] = mapped_column(Integer, nullable=False,
                                                 server_default=text("0"))
    # The run's tokens and cost summed from its ``usage`` events, recorded by the transaction
    # that ends it, so the per-agent outcome scans of partial hours read run rows rather than
    # each run's events. NULL until the run ends, and for runs that ended before these columns
    # existed (the reads sum their events instead). Cost NULL with tokens set: a call of the
    # run had no price. Not part of the API's run (its usage events are).
    usage_input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    usage_output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    usage_cost_usd: Mapped[float | None] = mapped_column(Float)
    # The executor's latest append that carried an ``Idempotency-Key``: the key's hash, the
    # request's checksum and the first seq it wrote. The same append sent again (its answer was
    # lost) is answered from these instead of being written twice. NULL until a keyed append.
    # Not part of the API's run.
    last_append_key_hash: Mapped[str | None] = mapped_column(String(64))
    last_append_checksum: Mapped[str | None] = mapped_column(String(64))
    last_append_first_seq: Mapped[int | None] = mapped_column(Integer)


class Message(Base):
    __tablename__ = "message"
    __table_args__ = (
        Index(None, "session_id", "created_at"),
        Index(None, "run_id"),
        Index(None, "role", "created_at"),
        # Deleting an archived child run's thread checks this foreign key: without the index,
        # each deleted thread scanned the whole message table (49 s per batch at 1.4M runs).
        Index(None, "thread_id"),
        # Every assistant message is produced by exactly one run, and a run produces at most one.
        Index(
            "uq_message_assistant_run",
            "run_id",
            unique=True,
            sqlite_where=text("role = 'assistant'"),
            postgresql_where=text("role = 'assistant'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str | None] = mapped_column(ForeignKey("chat_session.id"))
    thread_id: Mapped[str] = mapped_column(ForeignKey("conversation_thread.id"), nullable=False)
    owner_id: Mapped[str] = mapped_column(String(200), nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    content: Mapped[str] = mapped_column(Text, nullable=False)
    run_id: Mapped[str] = mapped_column(ForeignKey("agent_run.id"), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class RunEvent(Base):
    """Append-only; triggers refuse UPDATE and DELETE. ``hash`` chains to the previous event."""

    __tablename__ = "run_event"
    __table_args__ = (
        # PostgreSQL only: a few pages of BRIN make time-range scans over 100M events cheap.
        Index("ix_run_event_created_at_brin", "created_at",
              postgresql_using="brin").ddl_if(dialect="postgresql"),
        # The usage events of a set of runs (tokens and cost of the runs outcome reads scan)
        # without reading every other event of those runs: about one row per run.
        Index("ix_run_event_usage", "run_id", sqlite_where=text("type = 'usage'"),
              postgresql_where=text("type = 'usage'")),
        # PostgreSQL: one partition per month of run id (agentledger.core.event_partitions).
        {"postgresql_partition_by": "RANGE (run_id)"},
    )

    run_id: Mapped[str] = mapped_column(ForeignKey("agent_run.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(40), nullable=False)
    data: Mapped[Any] = mapped_column(JSONDoc, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    hash: Mapped[str] = mapped_column(String(64), nullable=False)


class ContextBlob(Base):
    """Content of context items, addressed by sha256, so a run's pack can be read back."""

    __tablename__ = "context_blob"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    content: Mapped[str] = mapped_column(Text, nullable=False)


class ApiToken(Base):
    """Only a sha256 of each token is stored; the token itself is shown once."""

    __tablename__ = "api_token"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    owner_id: Mapped[str] = mapped_column(String(200), nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class RateLimitWindow(Base):
    """Runs created per owner per minute, shared by every process through the database."""

    __tablename__ = "rate_limit_window"

    owner_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    count: Mapped[int] = mapped_column(Integer, nullable=False)


class _OutcomeMeasures:
    """What a rollup row sums: counts, latency and wait (sum, min, max and a log-scale
    histogram, ``agentledger.core.outcome_histogram``), tokens and cost."""

    runs: Mapped[int] = mapped_column(BigInteger, nullable=False)
    latency_n: Mapped[int] = mapped_column(BigInteger, nullable=False)
    latency_sum: Mapped[float] = mapped_column(Float, nullable=False)
    latency_min: Mapped[float | None] = mapped_column(Float)
    latency_max: Mapped[float | None] = mapped_column(Float)
    wait_n: Mapped[int] = mapped_column(BigInteger, nullable=False)
    wait_sum: Mapped[float] = mapped_column(Float, nullable=False)
    wait_min: Mapped[float | None] = mapped_column(Float)
    wait_max: Mapped[float | None] = mapped_column(Float)
    input_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    output_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    cost_usd: Mapped[float] = mapped_column(Float, nullable=False)  # of the runs with a known cost
    # Runs with a ``usage`` event whose ``cost_usd`` is null: their cost is unknown, not zero.
    runs_without_cost: Mapped[int] = mapped_column(BigInteger, nullable=False,
                                                   server_default=text("0"))


class AgentOutcomeRollup(_OutcomeMeasures, Base):
    """Ended runs per agent, version, UTC day of creation and terminal status.

    Maintained in the transaction that ends each run (``ingest.rollup``; bulk imports add their
    batches in aggregate), so per-agent outcomes over days never scan ``agent_run``. Sums give
    exact counts, tokens and cost; the ``latency_hNN`` / ``wait_hNN`` columns are fixed
    log-scale histograms (``agentledger.core.outcome_histogram``) from which percentiles are
    estimated. Latency is started → finished (runs that started); wait is created → started.
    """

    __tablename__ = "agent_outcome_rollup"
    __table_args__ = (
        Index(None, "day"),
        # The shard rows not yet folded into shard 0 (``ingest.rollup.fold_shards``), found
        # without reading the folded history.
        Index("ix_agent_outcome_rollup_unfolded", "day", sqlite_where=text("shard <> 0"),
              postgresql_where=text("shard <> 0")),
    )

    agent_id: Mapped[str] = mapped_column(String(63), primary_key=True)
    agent_version: Mapped[int] = mapped_column(Integer, primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    # Run endings spread over a few rows per key (``ingest.rollup.ROLLUP_SHARDS``): one hot
    # row would serialise every transaction that ends a run of a busy agent on its row lock.
    # Readers sum over shards; the shards of past periods are folded into shard 0.
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True, server_default=text("0"))


class AgentOutcomeRollupHour(_OutcomeMeasures, Base):
    """The same sums per UTC *hour* of creation, for the partial days at a window's edges: a
    window that does not start and end at midnight reads whole days from
    ``agent_outcome_rollup``, whole hours from here, and scans runs only for the partial hours
    (at most two), so its cost does not depend on the time of day."""

    __tablename__ = "agent_outcome_rollup_hour"
    __table_args__ = (
        Index(None, "hour"),
        Index("ix_agent_outcome_rollup_hour_unfolded", "hour", sqlite_where=text("shard <> 0"),
              postgresql_where=text("shard <> 0")),
    )

    agent_id: Mapped[str] = mapped_column(String(63), primary_key=True)
    agent_version: Mapped[int] = mapped_column(Integer, primary_key=True)
    hour: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True, server_default=text("0"))


class AgentOutcomeRollupMinute(_OutcomeMeasures, Base):
    """The same sums per UTC *minute* of creation, for the partial hours at a window's edges,
    kept for the recent past only (``agentledger.core.rollup_periods``): a window starting
    then scans runs of at most two partial minutes, however busy the hour it starts in."""

    __tablename__ = "agent_outcome_rollup_minute"
    __table_args__ = (
        Index(None, "minute"),
        Index("ix_agent_outcome_rollup_minute_unfolded", "minute",
              sqlite_where=text("shard <> 0"), postgresql_where=text("shard <> 0")),
    )

    agent_id: Mapped[str] = mapped_column(String(63), primary_key=True)
    agent_version: Mapped[int] = mapped_column(Integer, primary_key=True)
    minute: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True, server_default=text("0"))


for _table in (AgentOutcomeRollup.__table__, AgentOutcomeRollupHour.__table__,
               AgentOutcomeRollupMinute.__table__):
    for _column in (*LATENCY_COLUMNS, *WAIT_COLUMNS):
        _table.append_column(Column(_column, Integer, nullable=False, server_default=text("0")))
del _table, _column


class RunInterruptionCount(Base):
    """Runs ever ended ``interrupted``, per reason (``agentledger_runs_interrupted_total``).

    Added to in the transaction that ends a run interrupted (``ingest.rollup``; bulk imports add
    their batches), never lowered: archiving a run moves its rows out, not its count, so the
    counter a scrape reports never goes back.
    """

    __tablename__ = "run_interruption_count"

    reason: Mapped[str] = mapped_column(String(40), primary_key=True)
    runs: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ArchivedRun(Base):
    """A run moved out of the live tables by ``agentledger archive``: where it went and the
    head of its hash chain, so the archive file can be verified later. Its presence is also what
    lets the triggers allow deleting that run's events, and nothing else's."""

    __tablename__ = "archived_run"
    __table_args__ = (Index(None, "root_run_id"),)

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    root_run_id: Mapped[str] = mapped_column(String(40), nullable=False)
    archive_file: Mapped[str] = mapped_column(String(500), nullable=False)
    last_event_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    last_event_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    archived_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class AdminAction(Base):
    """Who did what to the ledger's configuration and when: tokens created and revoked, agents
    registered and re-versioned, runs cancelled, sessions deleted. Append-only like events
    (triggers refuse UPDATE and DELETE)."""

    __tablename__ = "admin_action"
    __table_args__ = (Index(None, "at"), Index(None, "action", "at"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    actor: Mapped[str] = mapped_column(String(200), nullable=False)
    actor_role: Mapped[str] = mapped_column(String(16), nullable=False)
    action: Mapped[str] = mapped_column(String(40), nullable=False)
    target_type: Mapped[str] = mapped_column(String(20), nullable=False)
    target_id: Mapped[str] = mapped_column(String(200), nullable=False)
    detail: Mapped[Any] = mapped_column(JSONDoc, nullable=False)


class OtlpSpan(Base):
    """A span received over OTLP/HTTP, kept as it arrived (one row per ``(trace_id,
    span_id)``: a re-export adds nothing). ``run_id`` is the run it was recorded in, NULL while
    its trace waits for its agent span (see docs/otlp.md)."""

    __tablename__ = "otlp_span"
    # (run_id, received_at): the reconciler's look for quiet traces still waiting (run_id NULL)
    __table_args__ = (Index(None, "received_at"), Index(None, "run_id", "received_at"))

    trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    span_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    parent_span_id: Mapped[str | None] = mapped_column(String(16))
    owner_id: Mapped[str] = mapped_column(String(200), nullable=False)
    service_name: Mapped[str] = mapped_column(String(200), nullable=False)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    start_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    end_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    status_code: Mapped[int] = mapped_column(SmallInteger, nullable=False)
    status_message: Mapped[str | None] = mapped_column(Text)
    attributes: Mapped[Any] = mapped_column(JSONDoc, nullable=False)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    run_id: Mapped[str | None] = mapped_column(String(40))
    # Values AGENTLEDGER_REDACT replaced in this span as it was stored: a run built from spans
    # counts its spans' in agent_run.redaction_count (the text it is built from has none left).
    redaction_count: Mapped[int] = mapped_column(Integer, nullable=False,
                                                 server_default=text("0"))


class OtlpConversation(Base):
    """The chat session of one owner's OTLP conversation id (``gen_ai.conversation.id`` or
    ``session.id``)."""

    __tablename__ = "otlp_conversation"

    owner_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(40), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
