"""Helpers for the execution tests: real ``agentledger`` processes, in-process executors, and
plain reads of what the ledger stored.

Processes
    ``ProcessManager`` starts ``agentledger serve`` / ``agentledger worker`` / other CLI commands
    as subprocesses, each in its own process group (``start_new_session``) with its own
    environment and its output captured to a log file under the test's ``tmp_path``. Servers get
    a free port and are waited for through ``GET /api/health``; workers through their start-up
    line. At teardown every group still alive is killed with ``SIGKILL`` (a gunicorn master and
    its workers together), every ``Popen`` is reaped and every log file closed, so nothing leaks
    into the next test. Failing waits raise with the tail of the logs.

In-process executors
    ``ExecutorPool`` creates ``Executor`` objects against a test database and, at teardown,
    stops them and waits until their run threads have let go of every run.

Reads
    ``events`` / ``run`` / ``assert_one_terminal_event`` read the tables directly (read-only
    engine), never through the code under test's own helpers. ``wait_until`` (``support.
    waiting``) and ``free_port`` (``support.ports``) are re-exported here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import select

from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.schema import AgentRun, Message, RunEvent
from agentledger.worker.executor import Executor
from support.ports import free_port
from support.waiting import wait_until

TERMINAL = ("succeeded", "failed", "cancelled", "interrupted")
TERMINAL_EVENTS = ("run.completed", "run.failed", "run.cancelled", "run.interrupted")
STATUS_OF_TERMINAL_EVENT = {
    "run.completed": "succeeded",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "run.interrupted": "interrupted",
}

# --------------------------------------------------------------------------------------------
# waiting and reading
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ev:
    seq: int
    type: str
    data: dict
    created_at: Any


def events(db: Database, run_id: str) -> list[Ev]:
    with db.read() as s:
        rows = s.execute(
            select(RunEvent.seq, RunEvent.type, RunEvent.data, RunEvent.created_at)
            .where(RunEvent.run_id == run_id).order_by(RunEvent.seq)
        ).all()
    return [Ev(r.seq, r.type, r.data, r.created_at) for r in rows]


def types(db: Database, run_id: str) -> list[str]:
    return [e.type for e in events(db, run_id)]


def run(db: Database, run_id: str):
    with db.read() as s:
        return s.execute(select(AgentRun.__table__).where(AgentRun.id == run_id)).one()


def runs(db: Database, **where) -> list:
    stmt = select(AgentRun.__table__).order_by(AgentRun.created_at, AgentRun.id)
    for column, value in where.items():
        stmt = stmt.where(getattr(AgentRun, column) == value)
    with db.read() as s:
        return list(s.execute(stmt).all())


def status(db: Database, run_id: str) -> str:
    with db.read() as s:
        return s.execute(select(AgentRun.status).where(AgentRun.id == run_id)).scalar_one()


def statuses(db: Database, run_ids) -> dict[str, str]:
    with db.read() as s:
        return dict(s.execute(
            select(AgentRun.id, AgentRun.status).where(AgentRun.id.in_(list(run_ids)))
        ).all())


def message_content(db: Database, message_id: str) -> str:
    with db.read() as s:
        return s.execute(select(Message.content).where(Message.id == message_id)).scalar_one()


def wait_for_status(db: Database, run_id: str, wanted, *, timeout: float = 60.0) -> str:
    wanted = (wanted,) if isinstance(wanted, str) else tuple(wanted)
    return wait_until(
        lambda: (st := status(db, run_id)) in wanted and st,
        timeout=timeout,
        message=lambda: f"run {run_id} to be {wanted} (it is {status(db, run_id)}; "
                        f"events {types(db, run_id)})",
    )


def wait_terminal(db: Database, run_ids, *, timeout: float = 60.0) -> dict[str, str]:
    run_ids = [run_ids] if isinstance(run_ids, str) else list(run_ids)

    def done():
        found = statuses(db, run_ids)
        return found if all(v in TERMINAL for v in found.values()) else None

    return wait_until(done, timeout=timeout,
                      message=lambda: f"runs to end; statuses now {statuses(db, run_ids)}")


def assert_one_terminal_event(db: Database, run_id: str) -> Ev:
    """Gapless seqs from 1, ``run.queued`` first, exactly one terminal event and it is the last,
    at most one ``run.started``, and the run's status matches its terminal event."""
    evs = events(db, run_id)
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1)), evs
    assert evs[0].type == "run.queued", evs
    terminal = [e for e in evs if e.type in TERMINAL_EVENTS]
    assert len(terminal) == 1, f"run {run_id}: terminal events {[e.type for e in evs]}"
    assert evs[-1] is terminal[0], f"run {run_id}: terminal event not last: {[e.type for e in evs]}"
    assert sum(e.type == "run.started" for e in evs) <= 1, [e.type for e in evs]
    row = run(db, run_id)
    assert row.status == STATUS_OF_TERMINAL_EVENT[terminal[0].type]
    assert row.last_event_seq == evs[-1].seq
    assert row.finished_at is not None
    return terminal[0]


# --------------------------------------------------------------------------------------------
# in-process executors
# --------------------------------------------------------------------------------------------


def fast_settings(db_url: str, **overrides) -> Settings:
    values = {"database_url": db_url, "lease_seconds": 5.0, "heartbeat_seconds": 0.5,
              "reconcile_seconds": 0.5, "secret_key": "test-secret"}
    values.update(overrides)
    return Settings(**values)


class ExecutorPool:
    """Started executors of one test; ``close()`` stops them and waits for their run threads."""

    def __init__(self, db: Database):
        self.db = db
        self.executors: list[Executor] = []

    def create(self, instance_id: str = "exec-1", *, concurrency: int = 4, **settings) -> Executor:
        """An executor that is stopped at teardown, not started yet."""
        executor = Executor(self.db, fast_settings(self.db.url, **settings),
                            instance_id=instance_id, concurrency=concurrency)
        self.executors.append(executor)
        return executor

    def start(self, instance_id: str = "exec-1", *, concurrency: int = 4, **settings) -> Executor:
        executor = self.create(instance_id, concurrency=concurrency, **settings)
        executor.start()
        return executor

    def close(self) -> None:
        for executor in self.executors:
            executor.stop(timeout=5.0)
        for executor in self.executors:
            # Run threads leave ``active`` in their ``finally``; after that they write nothing.
            deadline = time.monotonic() + 5.0
            while executor.active_run_ids and time.monotonic() < deadline:
                time.sleep(0.05)
            executor.notifier.stop()
        self.executors.clear()

    def __enter__(self) -> ExecutorPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# real processes
# --------------------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    base_url: str | None = None
    port: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, pattern: str, *, timeout: float = 60.0) -> re.Match:
        regex = re.compile(pattern)

        def found():
            match = regex.search(self.log())
            if match is None and not self.alive():
                raise AssertionError(f"{self.name} exited ({self.popen.returncode}) before "
                                     f"printing {pattern!r}:\n{self.log()[-4000:]}")
            return match

        return wait_until(found, timeout=timeout, interval=0.05,
                          message=lambda: f"{self.name} to print {pattern!r}:\n{self.log()[-4000:]}")

    def send(self, sig: int) -> None:
        """A signal to the process itself (not its group), like an operator's ``kill``."""
        self.popen.send_signal(sig)

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (a gunicorn master and its workers: a crash)."""
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def stop(self, *, timeout: float = 10.0) -> None:
        """A quick, orderly shutdown of the whole group (``SIGINT``: gunicorn's quick shutdown,
        open event streams do not delay it), then ``SIGKILL`` for whatever is left."""
        if self.alive():
            self.kill_group(signal.SIGINT)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill_group(signal.SIGKILL)
                self.popen.wait(timeout)
        self.kill_group(signal.SIGKILL)  # workers that outlived the master


class ProcessManager:
    """Starts CLI processes for one test and guarantees they are all gone at teardown."""

    def __init__(self, tmp_path: Path, *, env: dict[str, str] | None = None):
        self.dir = tmp_path
        self.procs: list[Proc] = []
        self._logs: list = []
        self.env = dict(env or {})
        self._counter = 0

    # ---- starting ------------------------------------------------------------------------

    def environment(self, db_url: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
        env.update({
            "AGENTLEDGER_DATABASE_URL": db_url,
            "AGENTLEDGER_SECRET_KEY": "process-test-secret",
            "PYTHONUNBUFFERED": "1",
            "PYTHONWARNINGS": "ignore",
        })
        env.update(self.env)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start(self, name: str, args: list[str], env: dict[str, str], *,
              argv: list[str] | None = None) -> Proc:
        """``agentledger <args>`` (or any ``argv``) in its own process group, logged to a file."""
        self._counter += 1
        log_path = self.dir / f"{self._counter:02d}-{name}.log"
        log_file = open(log_path, "w")  # noqa: SIM115 - closed in close()
        self._logs.append(log_file)
        popen = subprocess.Popen(
            argv or [sys.executable, "-m", "agentledger.cli", *args],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=self.dir, start_new_session=True,
        )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def run(self, args: list[str], env: dict[str, str], *, timeout: float = 60.0
            ) -> subprocess.CompletedProcess:
        """A short-lived command, run to completion (its output returned, not logged)."""
        return subprocess.run([sys.executable, "-m", "agentledger.cli", *args], env=env,
                              cwd=self.dir, capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)

    def serve(self, db_url: str, *, port: int | None = None, worker: bool = False,
              name: str = "serve", timeout: float = 60.0, args: tuple[str, ...] = (),
              default_workers: bool = False, threads: int | None = 16, **env: str) -> Proc:
        """``agentledger serve`` on a free port, waited for through ``/api/health``
        (``threads=None``: the command's default thread count; one HTTP worker process unless
        ``args`` names ``--workers`` or ``default_workers`` asks for the command's default)."""
        port = port or free_port()
        cli = ["serve", "--host", "127.0.0.1", "--port", str(port), *args]
        if threads is not None:
            cli += ["--threads", str(threads)]
        if "--workers" not in args and not default_workers:
            cli += ["--workers", "1"]  # one executor slot per server unless a test asks for more
        if not worker:
            cli.append("--no-worker")
        proc = self.start(name, cli, self.environment(db_url, **env))
        proc.port = port
        proc.base_url = f"http://127.0.0.1:{port}"
        self.wait_http(proc, timeout=timeout)
        return proc

    def wait_http(self, proc: Proc, *, timeout: float = 60.0) -> None:
        def healthy():
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited ({proc.popen.returncode}):\n"
                                     f"{proc.log()[-4000:]}")
            try:
                return requests.get(f"{proc.base_url}/api/health", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_until(healthy, timeout=timeout, interval=0.1,
                   message=lambda: f"{proc.name} to answer /api/health:\n{proc.log()[-4000:]}")

    def worker(self, db_url: str, instance_id: str, *, concurrency: int = 2,
               timeout: float = 60.0, **env: str) -> Proc:
        proc = self.start(instance_id, ["worker", "--instance-id", instance_id,
                                        "--concurrency", str(concurrency)],
                          self.environment(db_url, **env))
        proc.wait_for_log(rf"worker {re.escape(instance_id)} executing", timeout=timeout)
        return proc

    # ---- teardown ------------------------------------------------------------------------

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} (pid {p.pid}) =====\n{p.log()[-3000:]}" for p in self.procs)

    def close(self) -> None:
        for proc in self.procs:
            # Kill the whole group even if its leader is gone: gunicorn workers outlive a killed
            # master for a moment, and nothing of a test may survive it.
            proc.kill_group(signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.popen.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
                pass
        for log_file in self._logs:
            log_file.close()
        self._logs.clear()

    def __enter__(self) -> ProcessManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Api:
    """A tiny JSON client for a running server (``requests`` with a bearer token)."""

    def __init__(self, base_url: str, token: str):
        self.base_url = base_url
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, path: str, *, expect: int | None = None, **kwargs):
        response = self.http.request(method, self.base_url + path, timeout=10, **kwargs)
        if expect is not None:
            assert response.status_code == expect, (method, path, response.status_code,
                                                    response.text)
        return response

    def get(self, path: str, **kwargs) -> Any:
        return self.call("GET", path, expect=kwargs.pop("expect", 200), **kwargs).json()

    def post(self, path: str, body: Any = None, *, expect: int | None = None, **kwargs):
        return self.call("POST", path, json=body, expect=expect, **kwargs)

    def register_agent(self, agent_id: str, kind: str = "scripted", **fields) -> dict:
        body = {"id": agent_id, "name": agent_id.replace("-", " ").title(), "kind": kind, **fields}
        return self.post("/api/agents", body, expect=201).json()

    def new_session(self, agent_id: str) -> str:
        return self.post("/api/sessions", {"agent_id": agent_id}, expect=201).json()["id"]

    def send(self, session_id: str, content: str = "hello", **body) -> str:
        """Post a user message (a fresh Idempotency-Key each time); returns the run id."""
        response = self.post(f"/api/sessions/{session_id}/messages",
                             {"content": content, **body}, expect=202,
                             headers={"Idempotency-Key": f"key-{uuid.uuid4().hex}"})
        return response.json()["run_id"]

    def events(self, run_id: str) -> dict:
        return self.get(f"/api/agent-runs/{run_id}/events?limit=500")

    def tree(self, run_id: str) -> dict:
        return self.get(f"/api/agent-runs/{run_id}/tree")


def make_token(db_url: str, *, owner: str = "admin", role: str = "admin") -> str:
    from ingest.tokens import create_token

    db = Database(db_url)
    try:
        with db.write() as s:
            return create_token(s, owner_id=owner, role=role)[1]
    finally:
        db.dispose()
