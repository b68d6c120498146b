"""Where the agent frameworks keep their own memory: in the ledger's database.

- ``langgraph``: LangGraph's own checkpointer (``SqliteSaver`` / ``PostgresSaver``) on the
  ledger's database, tables ``checkpoints`` and ``writes`` (SQLite) or ``checkpoints``,
  ``checkpoint_blobs``, ``checkpoint_writes`` and ``checkpoint_migrations`` (PostgreSQL).
- ``openai-agents``: the Agents SDK's own ``SQLAlchemySession`` on the ledger's database, tables
  ``agent_sessions`` and ``agent_messages``.

These tables belong to the frameworks (their own schemas and their own migrations), so they are
created by the frameworks' ``setup()`` from ``agentledger db upgrade`` (and the migration step of
``serve`` / ``python app.py``) when the extra is installed, never by an Alembic migration.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from agentledger.core.config import sqlite_path
from agentledger.core.database import backend_name, normalize_url, one_off_connection

SDK_SESSIONS_TABLE = "agent_sessions"
SDK_MESSAGES_TABLE = "agent_messages"
# The PostgreSQL application_name of the ledger server's pooled memory connections.
CHECKPOINT_POOL_NAME = "agentledger-checkpoints"
SDK_POOL_NAME = "agentledger-sdk-sessions"

T = TypeVar("T")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def langgraph_installed() -> bool:
    return _installed("langgraph") and _installed("langgraph.checkpoint.sqlite") and _installed(
        "langgraph.checkpoint.postgres")


def openai_agents_installed() -> bool:
    # Finding the submodule imports the SDK itself (seconds of CPU): only where it will be used.
    return _installed("agents") and _installed("agents.extensions.memory")


def _has_tables(url: str, *names: str) -> bool:
    """Whether the ledger database already holds every one of ``names`` (an inspection only)."""
    with one_off_connection(url) as conn:
        return set(names) <= set(inspect(conn).get_table_names())


def _is_sqlite(url: str) -> bool:
    return backend_name(url) == "sqlite"


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def langgraph_checkpointer(url: str, *, serde: Any = None) -> Iterator:
    """LangGraph's own saver on the ledger database at ``url``, open for one run (or one
    request of the checkpoint routes, which pass their strict ``serde``)."""
    url = normalize_url(url)
    if _is_sqlite(url):
        from langgraph.checkpoint.sqlite import SqliteSaver

        path = sqlite_path(url)
        if path is None:
            raise ValueError("the langgraph checkpointer needs a SQLite file, not :memory:")
        conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
        try:
            yield SqliteSaver(conn, serde=serde)
        finally:
            conn.close()
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(_libpq(url)) as saver:
            if serde is not None:  # from_conn_string takes none
                saver.serde = serde
            yield saver


def postgres_checkpoint_pool(url: str, *, max_size: int):
    """A pool of connections for LangGraph's PostgreSQL saver on the ledger database at ``url``,
    set up as the saver's ``from_conn_string`` sets up its one connection; each connection is
    checked as it is taken, so one the database closed meanwhile is replaced, not used."""
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    return ConnectionPool(_libpq(normalize_url(url)), min_size=1, max_size=max_size, open=True,
                          check=ConnectionPool.check_connection, name=CHECKPOINT_POOL_NAME,
                          kwargs={"autocommit": True, "prepare_threshold": 0,
                                  "row_factory": dict_row,
                                  "application_name": CHECKPOINT_POOL_NAME})


def postgres_checkpointer(pool: Any, *, serde: Any = None) -> Any:
    """LangGraph's PostgreSQL saver on connections of ``pool`` (``postgres_checkpoint_pool``)."""
    from langgraph.checkpoint.postgres import PostgresSaver

    return PostgresSaver(pool, serde=serde)


def sdk_async_url(url: str) -> str:
    """The ledger URL for SQLAlchemy's asyncio engine (aiosqlite, psycopg's async mode)."""
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def sdk_engine(url: str, **options: Any):
    """An asyncio engine for the Agents SDK's sessions on the ledger database at ``url``."""
    from sqlalchemy.ext.asyncio import create_async_engine

    return create_async_engine(sdk_async_url(url), **options)


def sdk_session(session_id: str, url: str, *, create_tables: bool = False, engine: Any = None):
    """The Agents SDK's SQLAlchemy session on the ledger database (call inside an event loop),
    on an engine of its own unless ``engine`` (from ``sdk_engine``) is given."""
    from agents.extensions.memory import SQLAlchemySession

    return SQLAlchemySession(session_id, engine=engine or sdk_engine(url),
                             create_tables=create_tables, sessions_table=SDK_SESSIONS_TABLE,
                             messages_table=SDK_MESSAGES_TABLE)


class CheckpointSavers:
    """LangGraph's savers on the ledger database at ``url`` for one owner's runs or requests
    (an executor, a server's memory routes), which ``close`` them when they stop (a later
    saver opens them again).

    On PostgreSQL every saver takes its connections from one pool that the first saver opens
    (``postgres_checkpoint_pool``, at most ``max_connections``): a saver's own connection took
    about 12 ms to open against 0.2-0.3 ms for ``get_tuple`` on a pooled one, more than a
    trivial run's whole life, and connections opened per run are not bounded by anything. A
    saver holds a connection only for each of its calls, so a graph abandoned by a cancel keeps
    none. On SQLite each saver opens the file (about 0.1 ms) and closes it when done.
    """

    def __init__(self, url: str, *, max_connections: int):
        self.url = normalize_url(url)
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._pool: Any = None

    @contextmanager
    def saver(self, *, serde: Any = None) -> Iterator[Any]:
        if _is_sqlite(self.url):
            with langgraph_checkpointer(self.url, serde=serde) as saver:
                yield saver
        else:
            yield postgres_checkpointer(self._checkpoint_pool(), serde=serde)

    def _checkpoint_pool(self) -> Any:
        with self._lock:
            if self._pool is None:
                self._pool = postgres_checkpoint_pool(self.url, max_size=self.max_connections)
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


class SdkSessions:
    """The Agents SDK's sessions on the ledger database at ``url`` for one owner (an executor,
    a server's memory routes), sharing one asyncio engine of at most ``max_connections`` that
    the first call opens and ``close`` ends (a later call opens it again).

    A session on an engine of its own cost 8-10 ms per run to open on PostgreSQL against about
    1.6 ms for ``get_items`` on a shared one, and its connections were bounded by nothing. An
    engine's connections belong to the event loop that opened them, while the owner's callers
    are threads (a server's requests) or runs each on a loop of its own, so every session call
    runs on one event loop thread of the owner's (``call`` from a thread, ``acall`` from another
    loop).
    """

    def __init__(self, url: str, *, max_connections: int):
        self.url = normalize_url(url)
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    def _started(self) -> tuple[asyncio.AbstractEventLoop, Any]:
        with self._lock:
            if self._loop is None:
                named = ({} if _is_sqlite(self.url) else
                         {"connect_args": {"application_name": SDK_POOL_NAME}})
                self._engine = sdk_engine(self.url, pool_pre_ping=True,
                                          pool_size=self.max_connections, max_overflow=0,
                                          **named)
                self._loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(target=self._loop.run_forever,
                                                     name="agentledger-sdk-sessions", daemon=True)
                self._loop_thread.start()
            return self._loop, self._engine

    def _submit(self, thread_id: str, use: Callable[[Any], Awaitable[T]]):
        loop, engine = self._started()

        async def call() -> T:
            return await use(sdk_session(thread_id, self.url, engine=engine))

        return asyncio.run_coroutine_threadsafe(call(), loop)

    def call(self, thread_id: str, use: Callable[[Any], Awaitable[T]]) -> T:
        """``use(session)`` on the thread's session, waited for by this thread."""
        return self._submit(thread_id, use).result()

    async def acall(self, thread_id: str, use: Callable[[Any], Awaitable[T]]) -> T:
        """``use(session)`` on the thread's session, awaited on the caller's own event loop."""
        return await asyncio.wrap_future(self._submit(thread_id, use))

    def close(self) -> None:
        with self._lock:
            engine, loop, thread = self._engine, self._loop, self._loop_thread
            self._engine = self._loop = self._loop_thread = None
        if loop is not None and thread is not None:
            asyncio.run_coroutine_threadsafe(engine.dispose(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()


class FrameworkStorage:
    """The frameworks' memory on the ledger database for one owner: LangGraph's savers and the
    Agents SDK's sessions, their connections opened when first used and kept until ``close``."""

    def __init__(self, url: str, *, max_connections: int):
        self.url = normalize_url(url)
        self.checkpoints = CheckpointSavers(url, max_connections=max_connections)
        self.sessions = SdkSessions(url, max_connections=max_connections)

    def close(self) -> None:
        self.checkpoints.close()
        self.sessions.close()


async def _setup_sdk_tables(url: str) -> None:
    session = sdk_session("agentledger-setup", url, create_tables=True)
    try:
        await session._ensure_tables()  # creates the SDK's own tables (IF NOT EXISTS)
    finally:
        await session.engine.dispose()


def setup_framework_storage(url: str) -> list[str]:
    """Create the installed frameworks' tables on the ledger database; idempotent.

    Returns the frameworks set up (for the upgrade command's output)."""
    done = []
    if langgraph_installed():
        with langgraph_checkpointer(url) as saver:
            saver.setup()
        done.append("langgraph")
    # The SDK's setup is its ``create_all``, which leaves existing tables as they are, so once
    # both exist there is nothing for it to do, and every later start (serve, each worker
    # process, db upgrade) skips importing the SDK only to find that out.
    if _has_tables(url, SDK_SESSIONS_TABLE, SDK_MESSAGES_TABLE):
        done.append("openai-agents")
    elif openai_agents_installed():
        asyncio.run(_setup_sdk_tables(url))
        done.append("openai-agents")
    return done
