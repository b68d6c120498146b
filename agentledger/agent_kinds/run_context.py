"""What an agent kind sees of its run, and how it reports progress."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agentledger.core.hashing import storable_text
from agentledger.core.json_limits import MAX_ERROR_MESSAGE

if TYPE_CHECKING:
    from agentledger.agent_kinds.storage import FrameworkStorage


class RunCancelled(Exception):
    """Raised inside an agent when the run is being cancelled; the executor confirms it."""


# What an agent's own code may raise that fails its run: every ``Exception``, and the two
# ``BaseException``s code exits with (``sys.exit()`` in a node or a tool; a ``KeyboardInterrupt``
# raised by code, not the worker's Ctrl-C, which Python raises in the main thread). Left to
# run up, they would end the run's thread and leave the run running until its lease expired.
AGENT_RAISES = (Exception, SystemExit, KeyboardInterrupt)


def error_message(text: str) -> str:
    """An agent's failure as its run's error can hold it: text both databases store, at most
    ``MAX_ERROR_MESSAGE`` characters (the rest cut, saying how long it was). A message the
    ledger refused would leave the run running until its lease expired, ``interrupted``, with
    the agent's error lost."""
    text = storable_text(text)
    if len(text) <= MAX_ERROR_MESSAGE:
        return text
    tail = f" … (cut: {len(text):,} characters in all)"
    return text[:MAX_ERROR_MESSAGE - len(tail)] + tail


class AgentFailed(Exception):
    """Raised by an agent to end its run ``failed`` with ``{"code": code, "message": …}``."""

    def __init__(self, message: str, code: str = "agent_error"):
        super().__init__(message)
        self.code = code
        self.message = error_message(message)


class ExecutionPort(Protocol):
    """What the executor offers a running agent (implemented by ``worker.executor``)."""

    def emit(self, run_id: str, event_type: str, data: dict) -> None: ...
    def sleep(self, run_id: str, seconds: float) -> None: ...
    def delegate(self, run_id: str, children: list[dict[str, str]]) -> list[dict[str, Any]]: ...
    def check(self, run_id: str) -> None: ...


class MemoryPort(Protocol):
    """The run's thread's framework memory served by a ledger server, for an executor without
    database access (implemented by ``worker.http_backend``): ``call(operation, body)`` is one
    memory route of the run (``agentledger.api.routes_memory``), its answer as a dict. A refused
    value raises ``AgentFailed``; a lost lease the ledger's own ``LeaseLost``."""

    def call(self, operation: str, body: dict[str, Any]) -> dict[str, Any]: ...


class _ReadWhenAsked:
    """A run's history, read on first use (``history_source``) unless it was given: most agent
    kinds keep their own memory and never ask, and every read is a query."""

    def __set_name__(self, owner, name: str) -> None:
        self._slot = f"_{name}"

    def __get__(self, ctx, owner=None):
        if ctx is None:
            return None  # the field's default
        found = ctx.__dict__.get(self._slot)
        if found is None:
            source = ctx.__dict__.get("history_source")
            found = ctx.__dict__[self._slot] = source() if source is not None else []
        return found

    def __set__(self, ctx, value) -> None:
        ctx.__dict__[self._slot] = value


@dataclass
class RunContext:
    run_id: str
    thread_id: str
    input: str
    agent_execution_snapshot: dict[str, Any]
    context_pack_snapshot: dict[str, Any]
    context: list[dict[str, Any]]
    port: ExecutionPort
    # The thread's earlier turns, oldest first (CONTRACT §7): {"role", "content", "run_id",
    # "created_at"}; read from ``history_source`` the first time an agent asks, if not given.
    history: list[dict[str, Any]] = _ReadWhenAsked()  # type: ignore[assignment]
    answer_parts: list[str] = field(default_factory=list)
    # Where kinds that keep their framework's own memory (checkpoints, sessions) find it: the
    # ledger database, through the executor's connections to it (``storage``), or, for an
    # executor that works through the API only, the server's memory routes (``memory``; the same
    # tables behind them).
    storage: FrameworkStorage | None = field(default=None, repr=False)
    memory: MemoryPort | None = field(default=None, repr=False)
    # Extra keys of the run's ``run.completed`` data (e.g. ``awaiting_input`` of a paused graph).
    completion: dict[str, Any] = field(default_factory=dict)
    history_source: Callable[[], list[dict[str, Any]]] | None = field(default=None, repr=False)
    # Threads of the agent that a cancel left running (a graph node or a tool busy in plain
    # code, ``framework_thread``): fenced off from the run, they still work for it, so the
    # executor keeps the run's slot until they end.
    unfinished: list[threading.Thread] = field(default_factory=list, repr=False)

    @property
    def database_url(self) -> str | None:
        """The ledger database's URL, when this executor has access to it."""
        return self.storage.url if self.storage is not None else None

    @property
    def params(self) -> dict[str, Any]:
        return self.agent_execution_snapshot.get("params") or {}

    def say(self, text: str) -> None:
        """One ``message.delta``; the text becomes part of the answer."""
        self.port.emit(self.run_id, "message.delta", {"text": text})
        self.answer_parts.append(text)

    def emit(self, event_type: str, data: dict) -> None:
        self.port.emit(self.run_id, event_type, data)

    def sleep(self, seconds: float) -> None:
        """Wait, noticing a cancel within a second (raises ``RunCancelled``)."""
        self.port.sleep(self.run_id, seconds)

    def delegate(self, children: list[dict[str, str]]) -> list[dict[str, Any]]:
        """Create child runs, let any worker run them in parallel, wait for all of them."""
        return self.port.delegate(self.run_id, children)

    def check_cancel(self) -> None:
        """Raise ``RunCancelled`` when the run is being cancelled (and stop if it was dropped)."""
        self.port.check(self.run_id)

    def cancel_requested(self) -> bool:
        """Whether the run should stop now (cancel requested, or the run is no longer ours)."""
        try:
            self.port.check(self.run_id)
        except Exception:  # noqa: BLE001 - any refusal means: stop
            return True
        return False


# The run the calling thread or asyncio task is executing. A ContextVar, so that each executor
# thread has its own and asyncio tasks started inside a run (frameworks' own) inherit it.
_current: ContextVar[RunContext] = ContextVar("agentledger_current_run")


def current_run() -> RunContext:
    """The ``RunContext`` of the run being executed here; ``LookupError`` outside a run."""
    try:
        return _current.get()
    except LookupError:
        raise LookupError("current_run() called outside a run executed by agentledger") from None


def bind_current_run(ctx: RunContext):
    """Make ``ctx`` the current run of this thread; returns the token to ``unbind`` it with."""
    return _current.set(ctx)


def unbind_current_run(token) -> None:
    _current.reset(token)
