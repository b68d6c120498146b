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

import asyncio
import re
import threading
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
    SDK_POOL_NAME,
    langgraph_checkpointer,
    langgraph_installed,
    openai_agents_installed,
    postgres_checkpoint_pool,
    postgres_checkpointer,
    sdk_engine,
    sdk_session,
)
from agentledger.core.database import backend_name
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
    """The memory routes' connections to the ledger database, opened by the first request that
    needs them and kept for the life of the serving process (``close`` ends them).

    Opening them per request cost more than the work: on PostgreSQL a saver's own connection
    took 4-10 ms against 0.2-0.4 ms for ``get_tuple`` on an open one, and an SDK session's engine
    16 ms. So LangGraph's PostgreSQL saver takes a connection from a pool for each call (on
    SQLite a request opens the file, which costs about 0.1 ms), and the SDK's sessions share one
    asyncio engine. An engine's connections belong to the event loop that opened them while each
    request has a thread of the web server, so the sessions run on one event loop thread of
    their own.
    """

    def __init__(self, url: str, *, max_connections: int = 8):
        self.url = url
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._pool: Any = None
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    @contextmanager
    def saver(self, allowed: Allowed) -> Iterator[Any]:
        """LangGraph's saver on the ledger database, reading with the strict serializer."""
        if not langgraph_installed():
            raise FrameworkUnavailable("this ledger server cannot serve LangGraph checkpoints: "
                                       "install the langgraph extra on it "
                                       "(pip install 'agentledger[langgraph]')")
        serde = strict_serializer(allowed)
        try:
            if backend_name(self.url) == "sqlite":
                with langgraph_checkpointer(self.url, serde=serde) as saver:
                    yield saver
            else:
                yield postgres_checkpointer(self._checkpoint_pool(), serde=serde)
        except RefusedValue as exc:  # read back from the database
            raise _refusal(exc, "the thread's stored checkpoint") from None

    def _checkpoint_pool(self) -> Any:
        with self._lock:
            if self._pool is None:
                self._pool = postgres_checkpoint_pool(self.url, max_size=self.max_connections)
            return self._pool

    def on_session(self, thread_id: str, use: Callable[[Any], Awaitable[T]]) -> T:
        """``use(session)`` on the thread's SDK session, on the sessions' event loop."""
        if not openai_agents_installed():
            raise FrameworkUnavailable("this ledger server cannot serve Agents SDK sessions: "
                                       "install the openai-agents extra on it "
                                       "(pip install 'agentledger[openai-agents]')")
        with self._lock:
            if self._loop is None:
                named = ({} if backend_name(self.url) == "sqlite" else
                         {"connect_args": {"application_name": SDK_POOL_NAME}})
                self._engine = sdk_engine(self.url, pool_pre_ping=True,
                                          pool_size=self.max_connections, **named)
                self._loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(target=self._loop.run_forever,
                                                     name="agentledger-sdk-sessions", daemon=True)
                self._loop_thread.start()
            loop, engine = self._loop, self._engine

        async def call() -> T:
            return await use(sdk_session(thread_id, self.url, engine=engine))

        return asyncio.run_coroutine_threadsafe(call(), loop).result()

    def close(self) -> None:
        with self._lock:
            pool, engine, loop, thread = self._pool, self._engine, self._loop, self._loop_thread
            self._pool = self._engine = self._loop = self._loop_thread = None
        if pool is not None:
            pool.close()
        if loop is not None and thread is not None:
            asyncio.run_coroutine_threadsafe(engine.dispose(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()


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
