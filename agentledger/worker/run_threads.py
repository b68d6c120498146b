"""The threads claimed runs execute in: one is started only when none is idle, and a thread
that finished a run waits for the next one.

Starting a thread costs ≈ 110–130 µs of CPU (creating it, and the start handshake that waits
for it), handing a run to a waiting thread 4–7 µs; under 50 clients, starting one per run was
4–5 % of a server's GIL-holding samples. A thread that has waited ``idle_seconds`` without a run ends,
so an executor that was busy once does not keep its peak of threads. They are daemon threads,
like the per-run threads before them: a process that exits does not wait for an agent stuck in
a model call (the executor interrupts its runs when it stops).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("agentledger.executor")

IDLE_SECONDS = 60.0


class RunThreads:
    def __init__(self, name: str = "run", *, idle_seconds: float = IDLE_SECONDS):
        self._name = name
        self._idle_seconds = idle_seconds
        self._jobs: queue.SimpleQueue[tuple[Callable[..., object], tuple]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Threads waiting for a job that no ``submit`` has counted on yet. Each ``submit`` puts
        # one job and counts on one thread (an idle one, or one it starts); a waiting thread
        # leaves only by taking its count back.
        self._idle = 0
        self._started = 0

    @property
    def started(self) -> int:
        """Threads started so far (each is reused for as many runs as come while it waits)."""
        with self._lock:
            return self._started

    def submit(self, fn: Callable[..., object], *args) -> None:
        """Run ``fn(*args)`` in an idle thread, or in a new one when none is idle."""
        with self._lock:
            self._jobs.put((fn, args))
            if self._idle:
                self._idle -= 1
                return
            self._started += 1
            number = self._started
        # The new thread takes its first job from the queue too (jobs are alike: one is owed to
        # each thread counted on), not as a thread argument, which would outlive the run.
        threading.Thread(target=self._serve, daemon=True, name=f"{self._name}-{number}").start()

    def _serve(self) -> None:
        job: tuple[Callable[..., object], tuple] | None = self._jobs.get()
        while job is not None:
            fn, args = job
            job = None
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a job's failure must not end the thread
                log.exception("a run's thread raised")
            del fn, args  # nothing of a finished run is kept alive while waiting
            job = self._next_job()

    def _next_job(self) -> tuple[Callable[..., object], tuple] | None:
        with self._lock:
            self._idle += 1
        try:
            return self._jobs.get(timeout=self._idle_seconds)
        except queue.Empty:
            pass
        with self._lock:
            if self._idle:  # no submit counted on this thread: it ends
                self._idle -= 1
                return None
        # A submit counted on this thread as it timed out: its job is on its way.
        return self._jobs.get()
