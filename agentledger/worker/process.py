"""``agentledger worker``: a standalone executor process with its own reconciler."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

from agentledger.agent_kinds.storage import setup_framework_storage
from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.migrate import upgrade
from agentledger.core.notifier import EventNotifier
from agentledger.process_tuning import tune_for_long_running_process
from agentledger.worker.executor import Executor
from agentledger.worker.reconciler_loop import ReconcilerThread


def default_instance_id() -> str:
    return f"worker-{socket.gethostname()}-{os.getpid()}"


def run_worker_process(settings: Settings, *, instance_id: str | None, concurrency: int) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if concurrency < 1:
        raise SystemExit("--concurrency must be at least 1")
    upgrade(settings.database_url)
    setup_framework_storage(settings.database_url)
    db = Database.from_settings(settings)
    notifier = EventNotifier(db.url, is_postgres=db.is_postgres)
    db.add_notification_listener(notifier.signal)
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
        while not done.wait(0.5):
            pass
    finally:
        reconciler.stop()
        ended = executor.stop(reason="executor_shutdown")
        notifier.stop()
        print(f"worker {executor.instance_id} stopped; {len(ended)} run(s) interrupted "
              "(executor_shutdown)", flush=True)
        db.dispose()
    return 0
