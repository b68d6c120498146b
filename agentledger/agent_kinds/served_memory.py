"""A thread's framework memory, served to executors without database access: the ledger
server's side of the memory routes (``agentledger.api.routes_memory``).

Each function works on one thread (the run's, which the route found from the caller's lease)
through exactly what a worker on the database uses (``storage``): LangGraph's own SQLite or
PostgreSQL saver and the Agents SDK's own ``SQLAlchemySession`` on the ledger's database, so
the rows are the same whichever kind of worker wrote them and either continues a thread the
other began. LangGraph values come and go as ``memory_wire`` describes; what the server reads
from an executor it reads strictly, and a value it refuses, or a checkpoint its saver cannot
store, is ``ValidationFailed`` (422) with nothing written.

The connections are the process's, kept from one request to the next (``ServedMemory``):
opening them per request cost more than the request's own work.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg

from agentledger.agent_kinds.memory_wire import (
    RefusedValue,
    decode_typed,
    strict_serializer,
    thread_config,
    tuple_to_json,
)
from agentledger.agent_kinds.storage import (
    FrameworkStorage,
    langgraph_installed,
    openai_agents_installed,
)
from agentledger.core.errors import FrameworkUnavailable, ValidationFailed
from agentledger.core.hashing import storable_json

T = TypeVar("T")
Allowed = tuple[tuple[str, str], ...]
# LangGraph's SQLite saver puts a metadata filter's keys into its SQL and checks them with this
# pattern; the PostgreSQL saver does not need it. Checked here for both, before any query.
FILTER_KEY = re.compile(r"^[a-zA-Z0-9_.-]+$")
# What a saver raises for a checkpoint it cannot store (a value JSON or the database refuses).
_UNSTORABLE = (TypeError, ValueError, KeyError, psycopg.DataError)
_NOT_REBUILT = ("only LangGraph's safe types (datetimes, UUIDs, LangChain messages, LangGraph's "
                "own) and the types named in the server's AGENTLEDGER_CHECKPOINT_TYPES are read "
                "from an executor; run this agent on a worker with database access, or name "
                "the type there")


def _refusal(exc: RefusedValue, what: str) -> ValidationFailed:
    if exc.type_name is None:
        return ValidationFailed(f"{what}: {exc}")
    return ValidationFailed(f"{what} holds a value of type {exc.type_name}, which the ledger "
                            f"server does not rebuild: {_NOT_REBUILT}")


class ServedMemory:
    """The memory routes' connections to the ledger database (``FrameworkStorage``), opened by
    the first request that needs them and kept for the life of the serving process (``close``
    ends them): opening them per request cost more than the request's own work."""

    def __init__(self, url: str, *, max_connections: int = 8):
        self.storage = FrameworkStorage(url, max_connections=max_connections)

    @contextmanager
    def saver(self, allowed: Allowed) -> Iterator[Any]:
        """LangGraph's saver on the ledger database, reading with the strict serializer."""
        if not langgraph_installed():
            raise FrameworkUnavailable("this ledger server cannot serve LangGraph checkpoints: "
                                       "install the langgraph extra on it "
                                       "(pip install 'agentledger[langgraph]')")
        serde = strict_serializer(allowed)
        try:
            with self.storage.checkpoints.saver(serde=serde) as saver:
                yield saver
        except RefusedValue as exc:  # read back from the database
            raise _refusal(exc, "the thread's stored checkpoint") from None

    def on_session(self, thread_id: str, use: Callable[[Any], Awaitable[T]]) -> T:
        """``use(session)`` on the thread's SDK session, on the sessions' event loop."""
        if not openai_agents_installed():
            raise FrameworkUnavailable("this ledger server cannot serve Agents SDK sessions: "
                                       "install the openai-agents extra on it "
                                       "(pip install 'agentledger[openai-agents]')")
        return self.storage.sessions.call(thread_id, use)

    def close(self) -> None:
        self.storage.close()


def _load(saver: Any, value: dict[str, Any], what: str) -> Any:
    try:
        return saver.serde.loads_typed(decode_typed(value))
    except RefusedValue as exc:
        raise _refusal(exc, what) from None


# ---- LangGraph checkpoints -----------------------------------------------------------------


def get_checkpoint(memory: ServedMemory, thread_id: str, *, allowed: Allowed, checkpoint_ns: str,
                   checkpoint_id: str | None) -> dict[str, Any] | None:
    """The saver's ``get_tuple``: the thread's latest checkpoint of the namespace, or the one
    named; None when there is none."""
    with memory.saver(allowed) as saver:
        saved = saver.get_tuple(thread_config(thread_id, checkpoint_ns, checkpoint_id))
        return None if saved is None else tuple_to_json(saved, saver.serde)


def list_checkpoints(memory: ServedMemory, thread_id: str, *, allowed: Allowed, checkpoint_ns: str | None,
                     checkpoint_id: str | None, before: str | None,
                     filter: dict[str, Any] | None, limit: int) -> list[dict[str, Any]]:
    """The saver's ``list`` on the thread, newest first (``checkpoint_ns`` None: every
    namespace), at most ``limit``."""
    for key in filter or {}:
        if not FILTER_KEY.match(key):
            raise ValidationFailed(f"filter: key {key!r} may hold only letters, digits, '_', "
                                   "'.' and '-'")
    _check_storable(filter, "filter")
    config = thread_config(thread_id, "", checkpoint_id)
    if checkpoint_ns is None:
        del config["configurable"]["checkpoint_ns"]
    else:
        config["configurable"]["checkpoint_ns"] = checkpoint_ns
    before_config = None if before is None else {"configurable": {"checkpoint_id": before}}
    with memory.saver(allowed) as saver:
        return [tuple_to_json(saved, saver.serde)
                for saved in saver.list(config, filter=filter or None, before=before_config,
                                        limit=limit)]


def _check_storable(value: Any, where: str) -> None:
    """Free-form JSON of a request that reaches the saver's SQL (a metadata filter, a
    checkpoint's metadata, its channel versions) holds only what both databases store:
    ``ValidationFailed`` (422) naming where, before the saver is opened. PostgreSQL's saver
    sends it as ``jsonb`` or text, which refuse NUL, lone surrogates and NaN (a list's filter
    was a 500; LangGraph itself strips NUL only from metadata's top-level text); the SQLite
    saver would store them, so the rule is the same on both."""
    if value is not None:
        storable_json(value, where)  # a check only: the saver gets the value as sent


def _checked_checkpoint(value: Any) -> dict[str, Any]:
    if not (isinstance(value, dict) and isinstance(value.get("id"), str) and value["id"]
            and all(isinstance(value.get(k), dict)
                    for k in ("channel_values", "channel_versions", "versions_seen"))):
        raise ValidationFailed("checkpoint: not a LangGraph checkpoint (a map with id, "
                               "channel_values, channel_versions and versions_seen)")
    if len(value["id"]) > 200 or "\x00" in value["id"]:
        raise ValidationFailed("checkpoint: its id is at most 200 characters, without NUL")
    return value


def put_checkpoint(memory: ServedMemory, thread_id: str, *, allowed: Allowed, checkpoint_ns: str,
                   parent_checkpoint_id: str | None, checkpoint: dict[str, Any],
                   metadata: dict[str, Any], new_versions: dict[str, Any]) -> dict[str, Any]:
    """The saver's ``put`` (an upsert by checkpoint id: a repeated put stores the same row);
    the config that names the stored checkpoint."""
    _check_storable(metadata, "metadata")
    _check_storable(new_versions, "new_versions")
    with memory.saver(allowed) as saver:
        value = _checked_checkpoint(_load(saver, checkpoint, "the checkpoint"))
        try:
            return saver.put(thread_config(thread_id, checkpoint_ns, parent_checkpoint_id),
                             value, metadata, new_versions)
        except _UNSTORABLE as exc:
            raise ValidationFailed(f"the checkpoint could not be stored "
                                   f"({type(exc).__name__}: {exc})") from None


def put_writes(memory: ServedMemory, thread_id: str, *, allowed: Allowed, checkpoint_ns: str,
               checkpoint_id: str, task_id: str, task_path: str,
               writes: list[tuple[str, dict[str, Any]]]) -> int:
    """The saver's ``put_writes`` (stored once per task, channel and index: a repeated call
    changes nothing); every value is read before anything is written."""
    with memory.saver(allowed) as saver:
        loaded = [(channel, _load(saver, value, f"the write to channel {channel!r}"))
                  for channel, value in writes]
        try:
            saver.put_writes(thread_config(thread_id, checkpoint_ns, checkpoint_id), loaded,
                             task_id, task_path)
        except _UNSTORABLE as exc:
            raise ValidationFailed(f"the writes could not be stored "
                                   f"({type(exc).__name__}: {exc})") from None
    return len(loaded)


# ---- Agents SDK sessions -------------------------------------------------------------------


def session_items(memory: ServedMemory, thread_id: str, limit: int | None) -> list[Any]:
    """``get_items(limit)``: the latest ``limit`` items (all when None), oldest first."""
    return memory.on_session(thread_id, lambda session: session.get_items(limit))


def add_session_items(memory: ServedMemory, thread_id: str, items: list[dict[str, Any]]) -> int:
    memory.on_session(thread_id, lambda session: session.add_items(items))
    return len(items)


def pop_session_item(memory: ServedMemory, thread_id: str) -> Any:
    """``pop_item()``: the newest item, removed (None when the session is empty)."""
    return memory.on_session(thread_id, lambda session: session.pop_item())


def clear_session(memory: ServedMemory, thread_id: str) -> None:
    memory.on_session(thread_id, lambda session: session.clear_session())
