"""A framework's work in a thread of its own, so that a cancel ends the run within a second even
while a graph node or a tool is busy in plain code (CONTRACT §7).

A framework notices a cancel only where the ledger can reach into it: a callback, a streamed
chunk, the start of a node or a tool. A node in ``time.sleep`` or a CPU loop reaches none of them
for as long as it runs, and Python cannot stop a thread. So the framework runs in a thread of its
own, and the run's thread waits for it, looking at the cancel flag every ``CANCEL_POLL``. On a
cancel the run ends at once and the framework's thread is left to finish what it is doing,
fenced off from everything of the run:

- its events: the executor refuses every write of a run that is no longer running there (its
  ``check`` raises, so the framework's callbacks stop the graph at its next node, model or tool),
  and the ledger refuses an append to an ended run;
- the thread's framework memory (checkpoints, session items): the writes go through a
  ``WriteFence`` that the run's thread closes, after the writes under way, before the run's
  terminal event is written; the next run of the thread, on whichever worker claims it, never
  meets a write of the abandoned one;
- the executor's capacity: the thread is handed over in ``RunContext.unfinished`` and the
  executor keeps the run's slot until it ends.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from agentledger.agent_kinds.run_context import RunCancelled, RunContext

log = logging.getLogger("agentledger.agent_kinds")

CANCEL_POLL = 0.1  # seconds between two looks at the cancel flag
T = TypeVar("T")


class MemoryClosed(Exception):
    """Raised at a write to a thread's framework memory by work that a cancel left running
    after its run ended."""


class WriteFence:
    """Lets writes through until ``close``, which waits for the writes under way: after it
    returns, nothing more is written through the fence."""

    def __init__(self) -> None:
        self._state = threading.Condition()
        self._writing = 0
        self._closed = False

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._state:
            if self._closed:
                raise MemoryClosed("the run has ended; its abandoned work may not change the "
                                   "thread's memory")
            self._writing += 1
        try:
            yield
        finally:
            with self._state:
                self._writing -= 1
                self._state.notify_all()

    def close(self) -> None:
        # No time limit: a write left in flight could land after the next run of the thread
        # began. A write is one statement on the run's own connection, milliseconds.
        with self._state:
            self._closed = True
            self._state.wait_for(lambda: self._writing == 0)

    def guard(self, target: T, *names: str) -> T:
        """Route ``target``'s methods ``names`` (those it has, plain or async) through the fence,
        on this instance only (each run opens its own saver or session)."""
        for name in names:
            method = getattr(target, name, None)
            if method is not None:
                setattr(target, name, self._guarded(method))
        return target

    def _guarded(self, method: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(method):
            @functools.wraps(method)
            async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                with self.writing():
                    return await method(*args, **kwargs)
            return guarded_async

        @functools.wraps(method)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            with self.writing():
                return method(*args, **kwargs)
        return guarded


def run_in_own_thread(ctx: RunContext, work: Callable[[], T], *, fence: WriteFence,
                      name: str) -> T:
    """``work()``'s result (or exception), computed in a thread of its own, in a copy of this
    thread's context (``current_run()`` works there); ``RunCancelled`` within ``CANCEL_POLL`` of
    a cancel (or the executor's own signal when the run was dropped), the work then abandoned
    as the module says."""
    outcome: list[tuple[bool, Any]] = []
    finished = threading.Event()
    abandoned = threading.Event()
    context = contextvars.copy_context()

    def target() -> None:
        try:
            outcome.append((True, context.run(work)))
        except BaseException as exc:  # noqa: BLE001 - handed to the run's thread
            outcome.append((False, exc))
        finally:
            finished.set()
            if abandoned.is_set():
                log.info("run %s: the work its cancel left running has ended (%.1f s later)",
                         ctx.run_id, time.monotonic() - since)

    since = time.monotonic()
    thread = threading.Thread(target=target, name=f"agentledger-{name}-{ctx.run_id}", daemon=True)
    thread.start()
    while not finished.wait(CANCEL_POLL):
        if ctx.cancel_requested():
            fence.close()
            since = time.monotonic()
            abandoned.set()
            ctx.unfinished.append(thread)
            log.info("run %s: stopped while its agent is busy outside the framework; that work "
                     "finishes in the background, its writes refused", ctx.run_id)
            ctx.check_cancel()
            raise RunCancelled()
    ok, value = outcome[0]
    if ok:
        return value
    raise value
