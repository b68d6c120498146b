"""The executor's run threads (``worker.run_threads``): started only when none is idle, reused,
ended after idling, and no run lost when a submit meets a thread that is just timing out."""

from __future__ import annotations

import gc
import queue
import threading
import time
import weakref

from agentledger.worker.run_threads import RunThreads


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_thread_that_finished_a_run_takes_the_next_one():
    threads = RunThreads()
    ran: list[threading.Thread] = []
    for _ in range(3):
        done = threading.Event()
        threads.submit(lambda d=done: (ran.append(threading.current_thread()), d.set()))
        assert done.wait(5)
        _wait_for(lambda: threads._idle == 1)  # back to waiting before the next submit
    assert len(set(ran)) == 1 and threads.started == 1
    assert ran[0].daemon


def test_runs_at_once_get_threads_of_their_own_then_reuse_them():
    threads = RunThreads()
    release = threading.Event()
    running = threading.Semaphore(0)
    names: set[str] = set()

    def run() -> None:
        names.add(threading.current_thread().name)
        running.release()
        release.wait(10)

    for _ in range(3):
        threads.submit(run)
    for _ in range(3):
        assert running.acquire(timeout=5)
    assert threads.started == 3 and len(names) == 3
    release.set()
    _wait_for(lambda: threads._idle == 3)
    for _ in range(3):
        threads.submit(run)
    for _ in range(3):
        assert running.acquire(timeout=5)
    assert threads.started == 3


def test_a_thread_idle_too_long_ends_and_a_failing_run_does_not_end_it():
    threads = RunThreads(idle_seconds=0.2)
    seen: list[threading.Thread] = []

    def fail() -> None:
        seen.append(threading.current_thread())
        raise RuntimeError("the run's own failure")

    threads.submit(fail)
    _wait_for(lambda: threads._idle == 1)
    done = threading.Event()
    threads.submit(lambda: (seen.append(threading.current_thread()), done.set()))
    assert done.wait(5)
    assert seen[0] is seen[1] and threads.started == 1  # the failure did not end the thread
    _wait_for(lambda: not seen[0].is_alive())
    assert threads._idle == 0
    again = threading.Event()
    threads.submit(again.set)
    assert again.wait(5) and threads.started == 2


def test_no_run_is_lost_when_submits_meet_threads_timing_out():
    """Threads idle for a millisecond at most: submits keep landing as they time out."""
    threads = RunThreads(idle_seconds=0.001)
    count, lock = [0], threading.Lock()

    def job() -> None:
        with lock:
            count[0] += 1

    def submitter() -> None:
        for i in range(500):
            threads.submit(job)
            if i % 7 == 0:
                time.sleep(0.001)

    submitters = [threading.Thread(target=submitter) for _ in range(4)]
    for t in submitters:
        t.start()
    for t in submitters:
        t.join(30)
    _wait_for(lambda: count[0] == 2000)
    assert count[0] == 2000


class _TimingOutAsASubmitComes:
    """The run threads' job queue, whose waits with a timeout time out just as the test's
    submit lands: the thread finds the submit counted on it and must take the job."""

    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        self.submitted = threading.Event()

    def put(self, item) -> None:
        self.jobs.put(item)

    def get(self, timeout: float | None = None):
        if timeout is not None:
            assert self.submitted.wait(5)
            raise queue.Empty
        return self.jobs.get(timeout=5)


def test_a_submit_that_lands_as_the_idle_thread_times_out_is_run_by_it():
    threads = RunThreads()
    jobs = _TimingOutAsASubmitComes()
    threads._jobs = jobs  # type: ignore[assignment]
    first = threading.Event()
    threads.submit(first.set)
    assert first.wait(5)
    _wait_for(lambda: threads._idle == 1)
    second = threading.Event()
    threads.submit(second.set)  # counts on the idle thread
    jobs.submitted.set()  # which times out now
    assert second.wait(5), "the job of a submit that counted on a timing-out thread was lost"
    assert threads.started == 1


class _Run:
    """Stands for what a run's thread is handed (the claimed run, its bookkeeping)."""


def test_a_waiting_thread_keeps_nothing_of_the_run_it_finished():
    threads = RunThreads()
    run = _Run()
    gone = weakref.ref(run)
    done = threading.Event()
    threads.submit(lambda r: done.set(), run)
    del run
    assert done.wait(5)
    _wait_for(lambda: threads._idle == 1)
    gc.collect()
    assert gone() is None, "an idle thread still holds its finished run"
