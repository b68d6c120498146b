"""``agentledger worker``: a standalone executor process with its own reconciler, or, with
``--api URL --token TOKEN``, one that executes runs through a ledger server's executor routes and
never opens the database (the server's reconciler then watches its leases)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading

from agentledger.agent_kinds.storage import setup_framework_storage
from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.migrate import upgrade
from agentledger.core.notifier import EventNotifier
from agentledger.process_tuning import tune_for_long_running_process
from agentledger.worker.executor import Executor
from agentledger.worker.reconciler_loop import ReconcilerThread

log = logging.getLogger("agentledger.worker")


def default_instance_id() -> str:
    return f"worker-{socket.gethostname()}-{os.getpid()}"


# How long a stopped worker's exit waits for agent code still running in threads that Python's
# exit joins, before the process ends without them.
EXIT_GRACE_SECONDS = 5.0


def exit_past_stuck_threads(code: int) -> int:
    """``code``, with a watchdog that ends the process with it should Python's exit still be
    waiting ``EXIT_GRACE_SECONDS`` from now.

    Python's exit joins the threads that are not daemons and every thread of a
    ``concurrent.futures`` pool (LangGraph runs a graph's nodes in one). Agent code a cancel or
    the stop could not interrupt (a model call that hangs) keeps such a thread alive: the
    executor fenced it (nothing it does is written) and the worker's runs are recorded or left
    to the reconciler, but the process would outlive its stop by as long as the call hangs, and
    a supervisor would have to kill it. The watchdog is a daemon thread: an exit that is not
    held up ends the process, the watchdog with it."""

    def give_up() -> None:
        busy = [t.name for t in threading.enumerate()
                if t is not threading.main_thread() and t is not threading.current_thread()]
        log.warning("exiting without waiting for agent code still running after %.0f s "
                    "(threads: %s)", EXIT_GRACE_SECONDS, ", ".join(busy[:8]))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    watchdog = threading.Timer(EXIT_GRACE_SECONDS, give_up)
    watchdog.daemon = True
    watchdog.start()
    return code


def run_worker_process(settings: Settings, *, instance_id: str | None, concurrency: int,
                       api_url: str | None = None, token: str | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if concurrency < 1:
        raise SystemExit("--concurrency must be at least 1")
    if api_url is not None or token is not None:
        return _run_remote_worker(settings, instance_id=instance_id, concurrency=concurrency,
                                  api_url=api_url, token=token)
    upgrade(settings.database_url)
    setup_framework_storage(settings.database_url)
    db = Database.from_settings(settings)
    notifier = EventNotifier(db.url, is_postgres=db.is_postgres)
    notifier.hear_commits_of(db)
    executor = Executor(db, settings, instance_id=instance_id or default_instance_id(),
                        concurrency=concurrency, notifier=notifier)
    reconciler = ReconcilerThread(db, settings)
    done = threading.Event()
    tune_for_long_running_process()

    def on_signal(signum, _frame):
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    executor.start()
    reconciler.start()
    print(f"worker {executor.instance_id} executing up to {concurrency} run(s) from "
          f"{db.dialect}; lease {settings.lease_seconds:g}s, heartbeat "
          f"{settings.heartbeat_seconds:g}s", flush=True)
    try:
        while not done.wait(0.5) and executor.refusal is None:
            pass
    finally:
        reconciler.stop()
        ended = executor.stop(reason="executor_shutdown")
        notifier.stop()
        print(f"worker {executor.instance_id} stopped; {len(ended)} run(s) interrupted "
              "(executor_shutdown)", flush=True)
        db.dispose()
    if executor.refusal is not None:
        return _refused_claims("the ledger", executor.refusal.code, executor.refusal.message)
    return exit_past_stuck_threads(0)


def _refused_claims(ledger: str, code: str, message: str) -> int:
    """A claim refused for its own terms, said once: no retry changes them (exit status 2)."""
    print(f"agentledger worker: {ledger} refuses this worker's claims ({code}: {message})",
          file=sys.stderr, flush=True)
    return 2


def _run_remote_worker(settings: Settings, *, instance_id: str | None, concurrency: int,
                       api_url: str | None, token: str | None) -> int:
    from agentledger.client import ApiError, ExecutorClient

    if not api_url or not token:  # the command line refuses these first (agentledger.cli)
        raise SystemExit("--api and --token go together (an executor token for that server)")
    tune_for_long_running_process()
    # One line per claim at INFO (httpx logs every request): twice a second of noise while idle.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with ExecutorClient(api_url, token, instance_id or default_instance_id()) as client:
        try:
            client.run_forever(concurrency, settings=settings)
        except ApiError as exc:
            if exc.code == "validation_error":
                return _refused_claims(api_url, exc.code, exc.message)
            if exc.code not in ("unauthenticated", "forbidden"):
                raise
            print(f"agentledger worker: {api_url} refuses this token ({exc.code}: "
                  f"{exc.message}); --token must be a valid token of role executor",
                  file=sys.stderr, flush=True)
            return 2
    return exit_past_stuck_threads(0)
