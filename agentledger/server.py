"""``agentledger serve`` / ``python app.py``: gunicorn serving the app, plus in-process execution.

gunicorn's threaded workers (``gthread``) serve the API and dashboards; every open
Server-Sent-Events stream occupies one thread, so ``--threads`` bounds the number of concurrent
streams per process. Unless ``--no-worker`` is given, each gunicorn worker process also runs an
executor and a reconciler in background threads. Its executor id is stable across restarts
(``serve-<host>-<port>-<slot>``), so when the server starts again after a crash, the runs its
previous incarnation left unfinished end ``interrupted`` (``service_restart``).
"""

from __future__ import annotations

import logging
import socket
import sys

from gunicorn.app.base import BaseApplication

from agentledger.core.config import Settings
from agentledger.process_tuning import tune_for_long_running_process

log = logging.getLogger("agentledger.server")


def _is_empty(settings: Settings) -> bool:
    from agentledger.core.database import Database
    from queries.runs import ledger_is_empty

    db = Database.from_settings(settings)
    try:
        with db.read() as s:
            return ledger_is_empty(s)
    finally:
        db.dispose()


def _admin_login_link(settings: Settings, base_url: str) -> str:
    from agentledger.core.database import Database
    from ingest.admin_log import Actor, record
    from ingest.tokens import create_token

    db = Database.from_settings(settings)
    try:
        with db.write() as s:
            token_id, token = create_token(s, owner_id="admin", role="admin")
            record(s, Actor("server", "admin"), "token.created", "token", token_id,
                   {"owner": "admin", "role": "admin", "purpose": "printed login link"})
    finally:
        db.dispose()
    return f"{base_url}/login?token={token}"


class _Gunicorn(BaseApplication):
    def __init__(self, settings: Settings, options: dict, *, run_worker: bool, port: int,
                 concurrency: int, run_reconciler: bool = True):
        self.settings = settings
        self.options = options
        self.run_worker = run_worker
        self.run_reconciler = run_reconciler
        self.port = port
        self.concurrency = concurrency
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)
        self.cfg.set("pre_fork", self._pre_fork)
        self.cfg.set("post_worker_init", self._post_worker_init)
        self.cfg.set("worker_exit", self._worker_exit)

    def load(self):
        from agentledger.app_factory import create_app

        return create_app(self.settings)

    # Runs in the master before each fork: the lowest slot no live worker holds, so a worker
    # that replaces a dead one takes over its executor id and interrupts its leftovers.
    def _pre_fork(self, server, worker) -> None:
        used = {getattr(w, "agentledger_slot", None) for w in server.WORKERS.values()}
        worker.agentledger_slot = next(i for i in range(len(used) + 1) if i not in used)

    def _post_worker_init(self, worker) -> None:
        tune_for_long_running_process()
        from agentledger.worker.executor import Executor
        from agentledger.worker.reconciler_loop import ReconcilerThread

        state = worker.wsgi.extensions["agentledger"]
        if not self.run_worker:
            # Runs executed elsewhere (workers over the database or over --api) still need
            # their leases watched: a server reconciles unless told not to.
            if self.run_reconciler:
                reconciler = ReconcilerThread(state.db, self.settings)
                reconciler.start()
                worker.agentledger_background = (None, reconciler)
            return
        slot = getattr(worker, "agentledger_slot", 0)
        instance_id = f"serve-{socket.gethostname()}-{self.port}-{slot}"
        executor = Executor(state.db, self.settings, instance_id=instance_id,
                            concurrency=self.concurrency,
                            notifier=state.notifier)
        executor.start()
        reconciler = None
        if self.run_reconciler:
            reconciler = ReconcilerThread(state.db, self.settings)
            reconciler.start()
        worker.agentledger_background = (executor, reconciler)

    def _worker_exit(self, server, worker) -> None:
        background = getattr(worker, "agentledger_background", None)
        if background:
            executor, reconciler = background
            if reconciler is not None:
                reconciler.stop()
            if executor is not None:
                executor.stop(reason="executor_shutdown")


def serve(settings: Settings, *, host: str, port: int, run_worker: bool = True, demo: bool = False,
          workers: int = 1, threads: int = 128, concurrency: int = 4,
          run_reconciler: bool = True) -> int:
    from agentledger.core.migrate import upgrade

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if workers < 1 or threads < 1:
        raise SystemExit("--workers and --threads must be at least 1")
    upgrade(settings.database_url)
    from agentledger.agent_kinds.storage import setup_framework_storage

    setup_framework_storage(settings.database_url)
    if demo and _is_empty(settings):
        from agentledger.demo import seed

        print("empty database: seeding demo data…", flush=True)
        seed(settings, runs=300, days=14, seed=7, progress=True)
    base_url = f"http://{host}:{port}"
    print(f"agentledger on {base_url}  (database: {settings.database_url.split('@')[-1]})", flush=True)
    print(f"admin login: {_admin_login_link(settings, base_url)}", flush=True)
    options = {
        "bind": f"{host}:{port}",
        "workers": workers,
        "worker_class": "gthread",
        "threads": threads,
        "timeout": 60,
        "graceful_timeout": 10,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "info",
    }
    _Gunicorn(settings, options, run_worker=run_worker, port=port, concurrency=concurrency,
              run_reconciler=run_reconciler).run()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(serve(Settings.from_env(), host="127.0.0.1", port=8050))
