"""``agentledger serve`` / ``python app.py``: gunicorn serving the app, plus in-process execution.

gunicorn's threaded workers (``gthread``) serve the API and dashboards; every open
Server-Sent-Events stream occupies one thread, so ``--threads`` bounds the number of concurrent
streams per process. Unless ``--no-worker`` is given, each gunicorn worker process also runs an
executor in a background thread. Its executor id is stable across restarts
(``serve-<host>-<port>-<slot>``), so when the server starts again after a crash, the runs its
previous incarnation left unfinished end ``interrupted`` (``service_restart``). Every worker
process also runs a reconciler unless ``--no-reconciler`` is given, with or without
``--no-worker``: in a scale-out deployment (``serve --no-worker`` plus ``agentledger worker``
processes) the runs of a worker that died end ``interrupted`` (``lease_expired``) even when no
worker is left to reconcile them.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys

from gunicorn import util as gunicorn_util
from gunicorn.app.base import BaseApplication
from gunicorn.http import errors as http_errors
from gunicorn.workers.gthread import ThreadWorker

from agentledger.connection_balance import ABSENT, ConnectionCounts
from agentledger.core.config import Settings, StartupError, exit_status
from agentledger.process_tuning import tune_for_long_running_process

log = logging.getLogger("agentledger.server")

# gunicorn refuses longer request lines and headers before the app is asked. Its limits sit
# above what the app accepts (agentledger.web.request_limits), so that the app answers such
# requests in JSON; beyond them, ServeWorker answers in JSON too. 8190 is the longest
# request line gunicorn allows short of "unlimited".
LIMIT_REQUEST_LINE = 8_190
LIMIT_REQUEST_FIELDS = 200
LIMIT_REQUEST_FIELD_SIZE = 16_384
# How long an idle keep-alive connection stays open. A client that reuses a pooled connection
# just as the server closes it gets "connection reset" on that request, and a POST is not
# retried: with gunicorn's default of 2 s, a client pausing about two seconds between requests
# hit that window (seen in the test suite's real-server tests). Clients and proxies rarely
# pause this long on a connection they mean to reuse; nginx's own default is the same 75 s. The
# threaded worker keeps idle connections in its poller, not in a thread, so they cost a socket.
KEEPALIVE_SECONDS = 75
# Logged by each HTTP worker once it takes connections; ``ready_workers`` counts them in a log
# with a pattern made from the same format, so the two cannot drift apart.
WORKER_READY = "HTTP worker %d ready (slot %d)"
_WORKER_READY_PATTERN = re.compile(re.escape(WORKER_READY).replace("%d", r"\d+"))


def ready_workers(log_text: str) -> int:
    """How many HTTP workers a ``serve`` log says have started taking connections."""
    return len(_WORKER_READY_PATTERN.findall(log_text))


def _refusal(exc: BaseException) -> tuple[int, str, str, str]:
    """(status, reason, code, message) for an error gunicorn raised while reading a request."""
    if isinstance(exc, http_errors.LimitRequestLine):
        return 414, "URI Too Long", "invalid_request", "the request line is too long"
    if isinstance(exc, http_errors.LimitRequestHeaders):
        return (431, "Request Header Fields Too Large", "invalid_request",
                "the request headers are too large or too many")
    if isinstance(exc, http_errors.ParseException | ValueError):
        return 400, "Bad Request", "invalid_request", "the request is not valid HTTP"
    return 500, "Internal Server Error", "internal_error", "the server failed; the error was logged"


class ServeWorker(ThreadWorker):
    """gunicorn's threaded worker, with two changes: its own refusals (request line or headers
    too large, malformed HTTP) carry the JSON error envelope instead of an HTML page, and a new
    connection goes to the worker that holds the fewest (``agentledger.connection_balance``)."""

    # -- least-connections accepts ------------------------------------------------------------

    def _counts(self) -> ConnectionCounts | None:
        return getattr(self.app, "connection_counts", None)

    def publish_connection_count(self) -> None:
        counts = self._counts()
        if counts is not None:
            counts.publish(self.slot, self.nr_conns if self.alive else ABSENT)

    @property
    def slot(self) -> int:
        return getattr(self, "agentledger_slot", 0)

    def accept(self, server, listener):
        counts = self._counts()
        if counts is not None and counts.leave_to_another(self.slot, self.nr_conns, listener):
            return
        super().accept(server, listener)
        self.publish_connection_count()

    def finish_request(self, fs):
        super().finish_request(fs)  # a connection closed, or went back to the keep-alive set
        self.publish_connection_count()

    def notify(self):
        super().notify()  # at every turn of the worker's loop: idle connections it closed
        self.publish_connection_count()

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        self.publish_connection_count()

    def handle_quit(self, sig, frame):
        self.alive = False
        self.publish_connection_count()
        super().handle_quit(sig, frame)

    # -- JSON refusals ------------------------------------------------------------------------

    def handle_error(self, req, client, addr, exc):
        from agentledger.web.request_limits import json_error_bytes

        status, reason, code, message = _refusal(exc)
        if status == 500:
            self.log.exception("error handling request")
        else:
            self.log.warning("refused a request from %s: %s", (addr or ("",))[0], exc)
        try:
            gunicorn_util.write_nonblock(client, json_error_bytes(status, reason, code, message))
        except Exception:  # noqa: BLE001 - the client may be gone
            self.log.debug("failed to send the error response")


def default_workers(settings: Settings) -> int:
    """HTTP worker processes when ``--workers`` is not given: one per CPU core on PostgreSQL;
    1 on SQLite (one file, one writer at a time: more processes only wait on its lock)."""
    if settings.is_sqlite:
        return 1
    cores = os.process_cpu_count() if hasattr(os, "process_cpu_count") else os.cpu_count()
    return max(1, cores or 1)


def _is_empty(settings: Settings) -> bool:
    from agentledger.core.database import Database
    from queries.runs import ledger_is_empty

    db = Database.from_settings(settings)
    try:
        with db.read() as s:
            return ledger_is_empty(s)
    finally:
        db.dispose()


def _admin_login_link(settings: Settings, base_url: str) -> tuple[str, str]:
    """(token id, login link) of a new admin token."""
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
    return token_id, f"{base_url}/login?token={token}"


class _Gunicorn(BaseApplication):
    def __init__(self, settings: Settings, options: dict, *, run_worker: bool,
                 run_reconciler: bool, port: int, concurrency: int):
        self.settings = settings
        self.options = options
        self.run_worker = run_worker
        self.run_reconciler = run_reconciler
        self.port = port
        self.concurrency = concurrency
        # Created here, in the master, so that every worker it forks shares it.
        self.connection_counts = ConnectionCounts(options["workers"])
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)
        self.cfg.set("pre_fork", self._pre_fork)
        self.cfg.set("post_worker_init", self._post_worker_init)
        self.cfg.set("worker_exit", self._worker_exit)
        self.cfg.set("child_exit", self._child_exit)

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
        executor = reconciler = None
        if self.run_worker:
            instance_id = executor_instance_id(self.port, getattr(worker, "agentledger_slot", 0))
            executor = Executor(state.db, self.settings, instance_id=instance_id,
                                concurrency=self.concurrency,
                                notifier=state.notifier)
            executor.start()
        if self.run_reconciler:
            reconciler = ReconcilerThread(state.db, self.settings)
            reconciler.start()
        worker.agentledger_background = (executor, reconciler)
        worker.publish_connection_count()  # from now on new connections may be left to it
        log.info(WORKER_READY, os.getpid(), worker.slot)

    # Runs in the master when a worker has exited: its open-stream gauge no longer counts, and
    # neither do its connections (it may have died without saying so).
    def _child_exit(self, server, worker) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
        self.connection_counts.leave(getattr(worker, "agentledger_slot", 0))

    def _worker_exit(self, server, worker) -> None:
        executor, reconciler = getattr(worker, "agentledger_background", (None, None))
        if reconciler is not None:
            reconciler.stop()
        if executor is not None:
            executor.stop(reason="executor_shutdown")
        worker.wsgi.extensions["agentledger"].memory.close()


def executor_instance_id(port: int, slot: int) -> str:
    """The in-process executor of worker slot ``slot``: the same at every start of this server."""
    return f"serve-{socket.gethostname()}-{port}-{slot}"


def end_runs_of_retired_slots(settings: Settings, port: int, workers: int) -> int:
    """Runs left unfinished by the executors of slots this start will not run (the server ran
    with more workers before): each worker ends its own slot's leftovers when it starts, so
    these would wait for their leases and end ``lease_expired``. They end ``service_restart``
    here, in the master, before any worker starts (no executor of this server runs yet, and
    no other server can listen on this port of this host). Returns the runs ended."""
    from agentledger.core.database import Database
    from ingest.reconcile import (
        executor_ids_holding_runs,
        executor_run_ids,
        interrupt_executor_run,
    )

    prefix = executor_instance_id(port, 0)[:-1]
    db = Database.from_settings(settings)
    ended = 0
    try:
        with db.read(primary=True) as s:
            retired = [i for i in executor_ids_holding_runs(s, prefix)
                       if i[len(prefix):].isdigit() and int(i[len(prefix):]) >= workers]
        for instance in retired:
            with db.read(primary=True) as s:
                run_ids = executor_run_ids(s, instance)
            for run_id in run_ids:
                with db.write() as s:
                    ended += interrupt_executor_run(s, run_id, instance, reason="service_restart")
    finally:
        db.dispose()  # no connection may cross the fork into the workers
    if ended:
        log.warning("interrupted %d run(s) left by executor slots this start does not run "
                    "(service_restart)", ended)
    return ended


# The metrics directory's lock file (not ``*.db``: the collector reads only those), held open by
# the serving master for its whole life; its forked workers share the lock.
METRICS_LOCK_NAME = "agentledger-serve.lock"
_metrics_lock = None


def _prepare_metrics_dir() -> None:
    """Per-process metrics of every gunicorn worker, merged at each scrape (``/metrics``).

    prometheus_client picks file-backed values when it is first imported with
    ``PROMETHEUS_MULTIPROC_DIR`` set, so the variable is set here, in the master, before any
    worker is forked or imports it; the directory starts empty so no dead process's samples
    from an earlier run are counted. A directory another running ``serve`` uses is refused:
    emptying it would delete that server's live samples, and each server's scrape would then
    add up the other's processes with its own. The lock says which directory is in use.
    """
    import errno
    import fcntl
    import tempfile

    global _metrics_lock
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(
        prefix="agentledger-metrics-")
    try:
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        os.makedirs(path, exist_ok=True)
        holder = open(os.path.join(path, METRICS_LOCK_NAME), "a+", encoding="utf-8")
    except OSError as exc:
        raise StartupError(f"cannot use PROMETHEUS_MULTIPROC_DIR {path}: "
                           f"{exc.strerror or exc}") from None
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder.seek(0)
        other = holder.read().strip() or "?"
        holder.close()
        raise StartupError(f"PROMETHEUS_MULTIPROC_DIR {path} is in use by another agentledger "
                           f"serve (pid {other}); give each server a directory of its own"
                           ) from None
    holder.truncate(0)
    holder.write(f"{os.getpid()}\n")
    holder.flush()
    _metrics_lock = holder
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    if "prometheus_client" in sys.modules:
        # Imported before serve() (by an embedding program): its metrics would stay in memory.
        log.warning("prometheus_client was imported before serve(); per-process metrics may "
                    "not add up across workers")
    for name in os.listdir(path):
        if name.endswith(".db"):
            os.remove(os.path.join(path, name))


def _bind_address(host: str, port: int) -> str:
    """gunicorn's ``bind`` for ``host``: an IPv6 address goes in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_can_listen(bind: str) -> None:
    """Raise ``StartupError`` unless ``bind`` can be listened on: bound the way gunicorn binds
    (its address parsing and socket family, ``SO_REUSEADDR``, which lets a port be taken again
    while a stopped server's connections linger in TIME_WAIT but never while another socket
    listens on it), then released at once for gunicorn. Otherwise gunicorn finds out only after
    the start-up has printed its address and a login link, and retries for five seconds."""
    host, port = gunicorn_util.parse_address(bind)
    family = socket.AF_INET6 if gunicorn_util.is_ipv6(host) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            reason = (exc.strerror or str(exc)).strip()
            if reason[:1].isupper() and reason[1:2].islower():
                reason = reason[0].lower() + reason[1:]
            raise StartupError(f"cannot listen on {bind}: {reason}") from None


def serve(settings: Settings, *, host: str, port: int, run_worker: bool = True,
          run_reconciler: bool = True, demo: bool = False, workers: int | None = None,
          threads: int = 128, concurrency: int = 4) -> int:
    from agentledger.core.migrate import upgrade

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if workers is None:
        workers = default_workers(settings)
    if workers < 1 or threads < 1:
        raise SystemExit("--workers and --threads must be at least 1")
    bind = _bind_address(host, port)
    # Before anything is printed, migrated or created (the login link's token): a server that
    # cannot start says why in one line.
    try:
        check_can_listen(bind)
        settings.check_database()
        _prepare_metrics_dir()
        upgrade(settings.database_url)  # refuses a database migrated by a newer agentledger
    except StartupError as exc:
        print(f"agentledger: {exc}", file=sys.stderr, flush=True)
        return 2
    from agentledger.core.server_checks import maintenance_warning

    warning = maintenance_warning(settings.database_url)
    if warning:
        log.warning(warning)
    from agentledger.agent_kinds.storage import setup_framework_storage

    setup_framework_storage(settings.database_url)
    if run_worker:
        end_runs_of_retired_slots(settings, port, workers)
    if demo and _is_empty(settings):
        from agentledger.demo import seed

        print("empty database: seeding demo data…", flush=True)
        seed(settings, runs=300, days=14, seed=7, progress=True)
    base_url = f"http://{bind}"
    print(f"agentledger on {base_url}  (database: {settings.database_url.split('@')[-1]})", flush=True)
    token_id, login_link = _admin_login_link(settings, base_url)
    print(f"admin login: {login_link}", flush=True)
    # Every start makes a new admin token; its id is what ``token revoke`` takes.
    print(f"admin login token id: {token_id} (a new one at each start; revoke old ones with "
          f"`agentledger token revoke ID`)", flush=True)
    reconciling = (f"reconciler every {settings.reconcile_seconds:g}s" if run_reconciler
                   else "no reconciler")
    print(f"{workers} HTTP worker process(es); in each: "
          f"{'executor' if run_worker else 'no executor'}, {reconciling}", flush=True)
    options = {
        "bind": bind,
        "workers": workers,
        "worker_class": ServeWorker,
        "threads": threads,
        "timeout": 60,
        "graceful_timeout": 10,
        "keepalive": KEEPALIVE_SECONDS,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "info",
        "limit_request_line": LIMIT_REQUEST_LINE,
        "limit_request_fields": LIMIT_REQUEST_FIELDS,
        "limit_request_field_size": LIMIT_REQUEST_FIELD_SIZE,
    }
    _Gunicorn(settings, options, run_worker=run_worker, run_reconciler=run_reconciler, port=port,
              concurrency=concurrency).run()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(exit_status(lambda: serve(Settings.from_env(), host="127.0.0.1", port=8050)))
