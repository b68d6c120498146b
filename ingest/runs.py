"""Creating runs: a user message in a session (idempotent), or a delegated child run.

A run freezes its agent-execution snapshot and context-pack snapshot in the transaction that
creates it, together with its thread link and its first event, ``run.queued`` (seq 1).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import String, and_, bindparam, func, insert, literal, select, type_coerce
from sqlalchemy.orm import Session

from agentledger.core import cacheable_upsert, dialect
from agentledger.core.database import AutocommitWrites, Database, execute, read_one
from agentledger.core.errors import (
    CancelRequested,
    IdempotencyConflict,
    IllegalTransition,
    NotFound,
    UnknownAgent,
)
from agentledger.core.hashing import (
    GENESIS_HASH,
    canonical_json,
    context_pack_hash,
    event_hash,
    input_sha256,
    sha256_hex,
    snapshot_sha256,
    storable_json,
)
from agentledger.core.ids import new_id
from agentledger.core.redaction import Redactor, redactor_of
from agentledger.core.schema import (
    Agent,
    AgentRun,
    AgentVersion,
    ChatSession,
    ContextBlob,
    Message,
    RunEvent,
    UTCDateTime,
)
from agentledger.core.vocabulary import ACTIVE
from ingest.agents import check_runnable
from ingest.events import AppendKey, append_events, check_lease, lock_run, replayed_append
from ingest.rate_limits import take_run_slot
from ingest.sessions import create_thread
from queries.visibility import session_visible_to


@dataclass(frozen=True)
class ContextItem:
    id: str
    title: str
    content: str
    version: str | int | None = None


@dataclass(frozen=True)
class PostedMessage:
    """The 202 body of a message post, and whether it was replayed from an earlier request."""

    message_id: str
    run_id: str
    agent_id: str
    agent_name: str
    replayed: bool

    @property
    def events_url(self) -> str:
        return f"/api/agent-runs/{self.run_id}/events"

    def response(self) -> dict[str, str]:
        return {
            "message_id": self.message_id,
            "run_id": self.run_id,
            "events_url": self.events_url,
            "agent_id": self.agent_id,
            "agent_name": self.agent_name,
        }


def idempotency_key_hash(key: str) -> str:
    return sha256_hex("idempotency-key\n" + key)


def request_checksum(path: str, body: Any) -> str:
    """Same path and same JSON body (whatever its whitespace or key order) → same checksum."""
    return sha256_hex(canonical_json({"path": path, "body": body}))


def agent_snapshot(session: Session, agent_id: str) -> dict[str, Any]:
    """The frozen execution snapshot of the agent's current version."""
    row = session.execute(
        select(AgentVersion)
        .join(Agent, (Agent.id == AgentVersion.agent_id) & (Agent.latest_version == AgentVersion.version))
        .where(Agent.id == agent_id)
    ).scalar_one_or_none()
    if row is None:
        raise UnknownAgent(f"agent {agent_id!r} is not registered")
    return snapshot_of(row)


def snapshot_of(row: Any) -> dict[str, Any]:
    """The execution snapshot a run freezes of one agent version (an ``AgentVersion`` or a row
    with its columns)."""
    return {
        "agent_id": row.agent_id,
        "name": row.name,
        "version": row.version,
        "kind": row.kind,
        "model": row.model,
        "instructions": row.instructions,
        "tools": row.tools,
        "params": row.params,
        "content_hash": row.content_hash,
    }


def context_pack(items: list[ContextItem]) -> tuple[dict[str, Any], dict[str, str]]:
    """The pack snapshot (no contents, only their hashes) and the contents by hash."""
    entries = []
    blobs: dict[str, str] = {}
    for item in items:
        storable_json([item.id, item.title, item.content, item.version], "context")
        digest = sha256_hex(item.content)
        blobs[digest] = item.content
        entries.append(
            {"id": item.id, "title": item.title, "version": item.version, "sha256": digest}
        )
    return {"items": entries, "pack_hash": context_pack_hash(entries)}, blobs


def _store_blobs(session: Session, blobs: dict[str, str]) -> None:
    if blobs:
        session.execute(
            dialect.insert_ignoring_conflicts(session, ContextBlob.__table__, ["sha256"]),
            [{"sha256": k, "content": v} for k, v in blobs.items()],
        )


def _queued_event(run_id: str, data: dict, now: datetime) -> tuple[dict, str]:
    chain = event_hash(GENESIS_HASH, run_id, 1, "run.queued", data, now)
    return {"run_id": run_id, "seq": 1, "type": "run.queued", "data": data,
            "created_at": now, "hash": chain}, chain


def _replayed(run_id: str, message_id: str, agent_id: str, snapshot: dict[str, Any],
              stored_checksum: str, checksum: str) -> PostedMessage:
    if stored_checksum != checksum:
        raise IdempotencyConflict(
            "this Idempotency-Key was already used for a different request; use a new key"
        )
    return PostedMessage(message_id=message_id, run_id=run_id, agent_id=agent_id,
                         agent_name=snapshot["name"], replayed=True)


def _replay(session: Session, owner_id: str, key_hash: str, checksum: str) -> PostedMessage | None:
    row = session.execute(
        select(
            AgentRun.id,
            AgentRun.user_message_id,
            AgentRun.agent_id,
            AgentRun.agent_execution_snapshot,
            AgentRun.request_checksum,
        ).where(AgentRun.owner_id == owner_id, AgentRun.idempotency_key_hash == key_hash)
    ).one_or_none()
    if row is None:
        return None
    return _replayed(row.id, row.user_message_id, row.agent_id, row.agent_execution_snapshot,
                     row.request_checksum, checksum)


# The statements of a message post are built once (per dialect) and executed with parameters:
# building and cache-keying a statement costs more CPU than running it on a warm connection,
# and a post is the hottest write there is.

_INSERT_MESSAGE = insert(Message.__table__)
_INSERT_EVENT = insert(RunEvent.__table__)


@functools.cache
def _lookup_statement(dialect_name: str, *, scoped: bool):
    """One round trip for everything a post reads: the session (visible to the caller), an
    earlier run under the same idempotency key, the chosen agent's current version, and (on
    PostgreSQL) the database clock."""
    chat, run = ChatSession.__table__, AgentRun.__table__
    agent, version = Agent.__table__, AgentVersion.__table__
    clock = dialect.clock_column(dialect_name)
    stmt = (
        select(
            chat.c.thread_id, chat.c.agent_id, chat.c.owner_id,
            run.c.id.label("earlier_run_id"),
            run.c.user_message_id.label("earlier_message_id"),
            run.c.agent_id.label("earlier_agent_id"),
            run.c.agent_execution_snapshot.label("earlier_snapshot"),
            run.c.request_checksum.label("earlier_checksum"),
            version.c.name, version.c.version,
            version.c.kind, version.c.model, version.c.instructions, version.c.tools,
            version.c.params, version.c.content_hash,
            type_coerce(clock, UTCDateTime).label("now"),
        )
        .select_from(chat)
        .outerjoin(run, and_(run.c.owner_id == chat.c.owner_id,
                             run.c.idempotency_key_hash == bindparam("key_hash")))
        .outerjoin(agent, agent.c.id == func.coalesce(bindparam("agent_id", type_=String),
                                                      chat.c.agent_id))
        .outerjoin(version, and_(version.c.agent_id == agent.c.id,
                                 version.c.version == agent.c.latest_version))
        .where(chat.c.id == bindparam("session_id"), chat.c.deleted_at.is_(None))
    )
    if scoped:
        # the read side's rule (queries.visibility), in the same round trip
        stmt = stmt.where(session_visible_to(bindparam("visible_to", type_=String)))
    return stmt


@functools.cache
def _insert_run_statement(dialect_name: str):
    run = AgentRun.__table__
    return (
        cacheable_upsert.insert(dialect_name, run)
        .on_conflict_do_nothing(index_elements=["owner_id", "idempotency_key_hash"])
        .returning(run.c.id)
    )


def _create_run_postgres():
    """A new run with its user message and ``run.queued``, and the queue's NOTIFY, as one
    statement: each part is a data-modifying CTE fed by the run insert, so a key already used
    (ON CONFLICT DO NOTHING: no row) inserts nothing else and notifies nobody. The foreign keys
    of the message and the event are checked at the statement's end, when the run is there."""
    run, message, event = AgentRun.__table__, Message.__table__, RunEvent.__table__
    columns = [c.name for c in run.columns if c.name in _POSTED_RUN_COLUMNS]
    new_run = (
        cacheable_upsert.insert("postgresql", run)
        .values({c: bindparam(c, type_=run.c[c].type) for c in columns})
        .on_conflict_do_nothing(index_elements=["owner_id", "idempotency_key_hash"])
        .returning(run.c.id, run.c.session_id, run.c.thread_id, run.c.owner_id, run.c.input,
                   run.c.user_message_id, run.c.created_at)
        .cte("new_run")
    )
    new_message = insert(message).from_select(
        ["id", "session_id", "thread_id", "owner_id", "role", "content", "run_id", "created_at"],
        select(new_run.c.user_message_id, new_run.c.session_id, new_run.c.thread_id,
               new_run.c.owner_id, literal("user"), new_run.c.input, new_run.c.id,
               new_run.c.created_at),
    ).cte("new_message")
    new_event = insert(event).from_select(
        ["run_id", "seq", "type", "data", "created_at", "hash"],
        select(new_run.c.id, literal(1), literal("run.queued"),
               bindparam("event_data", type_=event.c.data.type), new_run.c.created_at,
               bindparam("event_hash", type_=String)),
    ).cte("new_event")
    return select(new_run.c.id, func.pg_notify(bindparam("channel", type_=String), new_run.c.id)
                  ).add_cte(new_message, new_event)


_POSTED_RUN_COLUMNS = frozenset({
    "id", "thread_id", "session_id", "root_run_id", "parent_run_id", "owner_id", "agent_id",
    "agent_version", "status", "agent_execution_snapshot", "context_pack_snapshot", "input",
    "user_message_id", "last_event_seq", "last_event_hash", "idempotency_key_hash",
    "request_checksum", "redaction_count", "created_at",
})
_CREATE_RUN_POSTGRES = _create_run_postgres()


def redacted_context(redactor: Redactor, items: list[ContextItem]) -> list[ContextItem]:
    """Context items as they may be stored: titles and contents redacted."""
    return [replace(item, title=redactor.text(item.title), content=redactor.text(item.content))
            if isinstance(item.title, str) and isinstance(item.content, str) else item
            for item in items]


def post_message(
    session: Session,
    *,
    owner_id: str,
    session_id: str,
    idempotency_key: str,
    checksum: str | None = None,
    content: str,
    agent_id: str | None = None,
    context: list[ContextItem] | None = None,
    visible_to: str | None = None,
    rate_limit_per_minute: int = 0,
    request: tuple[str, Any] | None = None,
) -> PostedMessage:
    """One user message = one run, created at most once per (owner, idempotency key).

    ``owner_id`` is the caller; the run is owned by the session's owner. ``visible_to`` is the
    owner whose sessions the caller may use (None for admins). A replay of
    the same request returns the original result with ``replayed=True``; a different request
    under the same key raises ``IdempotencyConflict``. Concurrent duplicates are settled by the
    unique constraint on ``(owner_id, idempotency_key_hash)``, not by the look-up that precedes it.
    New runs (not replays) count against ``rate_limit_per_minute`` per owner (0: no limit).

    ``request`` (path, JSON body as sent) gives the idempotency checksum, computed on the body
    *as redacted* (``AGENTLEDGER_REDACT``), so no hash of an unredacted value is stored and the
    same request still hashes the same; callers without a body pass ``checksum`` instead.
    """
    redactor = redactor_of(session)
    if redactor.active:
        content = redactor.text(content)
        context = redacted_context(redactor, context or [])
    if request is not None:
        checksum = request_checksum(request[0], redactor.for_run().value(request[1]))
    if checksum is None:
        raise ValueError("post_message needs the request or its checksum")
    key_hash = idempotency_key_hash(idempotency_key)
    chat = _found(read_one(session, _lookup_statement(dialect.name(session),
                                                      scoped=visible_to is not None),
                           _lookup_params(session_id, visible_to, agent_id, key_hash)),
                  session_id)
    replayed = _replay_of_lookup(chat, checksum)
    if replayed is not None:
        return replayed
    now = dialect.now(session, read=chat.now)
    pack, blobs = context_pack(context or [])
    new = _new_run(chat, session_id=session_id, agent_id=agent_id, content=content, pack=pack,
                   key_hash=key_hash, checksum=checksum, redaction_count=redactor.count, now=now)
    postgres = dialect.name(session) == "postgresql"
    if postgres:
        # The run, its user message, run.queued and the queue's NOTIFY in one round trip.
        inserted = execute(session, _CREATE_RUN_POSTGRES, new.create_params()).first()
    else:
        inserted = session.execute(_insert_run_statement(dialect.name(session)), new.row).first()
    if inserted is None:
        # A concurrent request with the same key committed first: answer as its replay.
        earlier = _replay(session, new.row["owner_id"], key_hash, checksum)
        if earlier is None:  # pragma: no cover - the conflicting row is committed and visible
            raise IdempotencyConflict("a concurrent request with this key did not complete")
        return earlier
    # Counted once the run is in: a concurrent duplicate of this request (which inserted
    # nothing above and answers as a replay) takes no slot, and past the limit the refusal
    # rolls the run back with the count. The owner's counter row is locked last, for the
    # shortest time, by every post.
    # The run belongs to the conversation's owner (see _new_run).
    take_run_slot(session, chat.owner_id, rate_limit_per_minute, now=now)

    if postgres:
        dialect.notified(session, dialect.QUEUE_CHANNEL, new.run_id)
    else:
        session.execute(_INSERT_MESSAGE, new.user_message())
        session.execute(_INSERT_EVENT, [new.queued])
        dialect.notify(session, dialect.QUEUE_CHANNEL, new.run_id)
    _store_blobs(session, blobs)
    return new.posted


def post_message_alone(
    db: Database,
    *,
    owner_id: str,
    session_id: str,
    idempotency_key: str,
    content: str,
    request: tuple[str, Any],
    agent_id: str | None = None,
    context: list[ContextItem] | None = None,
    visible_to: str | None = None,
    rate_limit_per_minute: int = 0,
) -> PostedMessage:
    """A message post that is its own transaction: what ``post_message`` does in a
    ``db.write()`` of its own, with the same checks, rows, errors and result.

    On PostgreSQL, when the post has nothing to write besides the run's one statement (no
    per-owner rate limit, whose counter is a second write; no redaction rules; no context
    items, whose contents are stored as blobs), the look-up and that statement run on a
    connection in autocommit: two round trips, no ``BEGIN``, no ``COMMIT``, no ORM session. A
    transaction would add nothing: the look-up locks nothing, so under READ COMMITTED the
    insert would follow an equally unlocked read, and the insert is one statement (the run,
    its user message, ``run.queued`` and the queue's ``NOTIFY``), atomic alone. A key used
    since the look-up (a concurrent duplicate: the unique constraint's ``ON CONFLICT DO
    NOTHING`` inserts nothing) takes the transaction, whose look-up answers as its replay.
    """
    if db.is_postgres and rate_limit_per_minute <= 0 and not db.redactor.active and not context:
        with db.autocommit_writes() as alone:
            assert alone is not None
            posted = _post_alone(alone, session_id=session_id, agent_id=agent_id,
                                 content=content, visible_to=visible_to,
                                 key_hash=idempotency_key_hash(idempotency_key),
                                 checksum=request_checksum(*request))
        if posted is not None:
            return posted
    with db.write() as s:
        return post_message(s, owner_id=owner_id, session_id=session_id,
                            idempotency_key=idempotency_key, request=request, content=content,
                            agent_id=agent_id, context=context, visible_to=visible_to,
                            rate_limit_per_minute=rate_limit_per_minute)


def _post_alone(alone: AutocommitWrites, *, session_id: str, agent_id: str | None, content: str,
                visible_to: str | None, key_hash: str, checksum: str) -> PostedMessage | None:
    """The autocommit post of ``post_message_alone``; None when the key was taken since the
    look-up."""
    chat = _found(alone.read_one(_lookup_statement("postgresql", scoped=visible_to is not None),
                                 _lookup_params(session_id, visible_to, agent_id, key_hash)),
                  session_id)
    replayed = _replay_of_lookup(chat, checksum)
    if replayed is not None:
        return replayed
    new = _new_run(chat, session_id=session_id, agent_id=agent_id, content=content,
                   pack=context_pack([])[0], key_hash=key_hash, checksum=checksum,
                   redaction_count=0, now=chat.now.astimezone(UTC))
    if alone.write(_CREATE_RUN_POSTGRES, new.create_params()).first() is None:
        return None
    alone.notified(dialect.QUEUE_CHANNEL, new.run_id)
    return new.posted


def _lookup_params(session_id: str, visible_to: str | None, agent_id: str | None,
                   key_hash: str) -> dict[str, Any]:
    return {"session_id": session_id, "visible_to": visible_to, "agent_id": agent_id,
            "key_hash": key_hash}


def _found(chat, session_id: str) -> Any:
    """The look-up's row; ``NotFound`` for a session the caller may not see."""
    if chat is None:
        raise NotFound(f"session {session_id} does not exist")
    return chat


def _replay_of_lookup(chat, checksum: str) -> PostedMessage | None:
    """The earlier run's replay when the look-up found the key used, else None."""
    if chat.earlier_run_id is not None:
        return _replayed(chat.earlier_run_id, chat.earlier_message_id, chat.earlier_agent_id,
                         chat.earlier_snapshot, chat.earlier_checksum, checksum)
    return None


@dataclass(frozen=True)
class _NewRun:
    """A posted message's run row and its ``run.queued`` event, made of the look-up's row."""

    row: dict[str, Any]
    queued: dict[str, Any]
    posted: PostedMessage

    @property
    def run_id(self) -> str:
        return self.row["id"]

    def user_message(self) -> dict[str, Any]:
        row = self.row
        return {"id": row["user_message_id"], "session_id": row["session_id"],
                "thread_id": row["thread_id"], "owner_id": row["owner_id"], "role": "user",
                "content": row["input"], "run_id": row["id"], "created_at": row["created_at"]}

    def create_params(self) -> dict[str, Any]:
        """The parameters of ``_CREATE_RUN_POSTGRES``."""
        return {**self.row, "event_data": self.queued["data"], "event_hash": self.queued["hash"],
                "channel": dialect.QUEUE_CHANNEL}


def _new_run(chat, *, session_id: str, agent_id: str | None, content: str, pack: dict[str, Any],
             key_hash: str, checksum: str, redaction_count: int, now: datetime) -> _NewRun:
    # The run belongs to the conversation's owner, and so does the idempotency key space
    # (an admin posting into a user's session acts within that user's keys).
    chosen_agent = agent_id or chat.agent_id
    if chat.version is None:
        raise UnknownAgent(f"agent {chosen_agent!r} is not registered")
    check_runnable(chosen_agent, chat.kind)
    # The looked-up row has the version's columns; its agent_id is the session's agent.
    snapshot = {**snapshot_of(chat), "agent_id": chosen_agent}
    run_id, message_id = new_id("run"), new_id("msg")
    queued, chain = _queued_event(
        run_id, {"agent_id": chosen_agent, "session_id": session_id, "parent_run_id": None,
                 "input_sha256": input_sha256(content),
                 "agent_snapshot_sha256": snapshot_sha256(snapshot),
                 "context_pack_sha256": snapshot_sha256(pack)}, now
    )
    row = {
        "id": run_id,
        "thread_id": chat.thread_id,
        "session_id": session_id,
        "root_run_id": run_id,
        "parent_run_id": None,
        "owner_id": chat.owner_id,
        "agent_id": chosen_agent,
        "agent_version": snapshot["version"],
        "status": "queued",
        "agent_execution_snapshot": snapshot,
        "context_pack_snapshot": pack,
        "input": content,
        "user_message_id": message_id,
        "last_event_seq": 1,
        "last_event_hash": chain,
        "idempotency_key_hash": key_hash,
        "request_checksum": checksum,
        "redaction_count": redaction_count,
        "created_at": now,
    }
    return _NewRun(row, queued, PostedMessage(message_id=message_id, run_id=run_id,
                                              agent_id=chosen_agent, agent_name=snapshot["name"],
                                              replayed=False))


def create_child_run(
    session: Session,
    parent_run_id: str,
    *,
    agent_id: str,
    input: str,
    executor_instance_id: str | None = None,
    key: AppendKey | None = None,
) -> str:
    """Delegation: a child run with its own thread, no session, and the parent's context pack.

    The parent must be running (and, for an executor, leased by it); ``run.child_created`` is
    appended to the parent in the same transaction. ``key``: the executor's
    ``Idempotency-Key`` for this request: the same request sent again answers the child it
    created (its ``run.child_created`` is the parent's append under that key).
    """
    redactor = redactor_of(session)
    input = redactor.text(input)
    parent = lock_run(session, parent_run_id)
    if (replay := replayed_append(parent, key, 1)) is not None:
        created = session.execute(select(RunEvent.data).where(
            RunEvent.run_id == parent_run_id, RunEvent.seq == replay.seqs[0])).scalar_one()
        return created["child_run_id"]
    now = dialect.now(session, read=parent.now)
    if executor_instance_id is not None:
        check_lease(parent, executor_instance_id, now)
    if parent.status == "cancelling":
        # As for an ending refused while cancelling: the caller learns to stop, not only no.
        raise CancelRequested(f"run {parent_run_id} is being cancelled; it cannot delegate now")
    if parent.status not in ACTIVE:
        raise IllegalTransition(f"run {parent_run_id} is {parent.status}; it cannot delegate now")
    snapshot = agent_snapshot(session, agent_id)
    check_runnable(agent_id, snapshot["kind"])
    parent_row = session.execute(
        select(AgentRun.root_run_id, AgentRun.context_pack_snapshot).where(
            AgentRun.id == parent_run_id
        )
    ).one()
    thread_id = create_thread(session, parent.owner_id, now)
    run_id = new_id("run")
    queued, chain = _queued_event(
        run_id, {"agent_id": agent_id, "session_id": None, "parent_run_id": parent_run_id,
                 "input_sha256": input_sha256(input),
                 "agent_snapshot_sha256": snapshot_sha256(snapshot),
                 "context_pack_sha256": snapshot_sha256(parent_row.context_pack_snapshot)}, now
    )
    session.execute(
        insert(AgentRun).values(
            id=run_id,
            thread_id=thread_id,
            session_id=None,
            root_run_id=parent_row.root_run_id,
            parent_run_id=parent_run_id,
            owner_id=parent.owner_id,
            agent_id=agent_id,
            agent_version=snapshot["version"],
            status="queued",
            agent_execution_snapshot=snapshot,
            context_pack_snapshot=parent_row.context_pack_snapshot,
            input=input,
            last_event_seq=1,
            last_event_hash=chain,
            redaction_count=redactor.count,
            created_at=now,
        )
    )
    session.execute(insert(RunEvent), [queued])
    append_events(
        session,
        parent_run_id,
        [("run.child_created", {"child_run_id": run_id, "agent_id": agent_id})],
        now=now,
        key=key,
    )
    dialect.notify(session, dialect.QUEUE_CHANNEL, run_id)
    return run_id
