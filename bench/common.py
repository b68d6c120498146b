"""Shared pieces of the benchmark: timing and percentiles, result rows, database URLs, the
``agentledger serve`` subprocess, and the bench's own agent, tokens and runs.

Timing: every latency is ``time.perf_counter()`` around one complete operation (one HTTP
request with its response body read, one read transaction, one raw transaction). Percentiles
are linear interpolation between the closest ranks of the sorted samples (numpy's default);
with n samples p99 is meaningful only when n ≥ 100, so the sizes in ``Sizes`` keep the point
reads at ≥ 200 samples in the full run (≥ 30 with ``--quick``, where p99 ≈ the maximum).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from sqlalchemy.engine import make_url

from agentledger.core.database import Database, normalize_url

BENCH_AGENT = "bench-echo"
BENCH_EXECUTOR = "bench-executor"


# ---- sizes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How long / how many: the full run, ``--quick`` (the whole suite in < 3 minutes) and
    ``--smoke`` (does every part run?)."""

    write_seconds: float = 10.0      # each write throughput phase (per path)
    point_reads: int = 300           # samples per point read (provenance, run, events, tree)
    list_reads: int = 100            # run list, interrupted list, timeline, lease health
    outcome_reads: int = 50          # per window
    sse_streams: int = 100
    sse_appends: int = 300
    dashboard_loads: int = 5         # first loads per page (the median load is reported)
    peer_single: int = 50            # sequential runs at concurrency 1
    peer_seconds: float = 10.0       # each runs/s phase
    otlp_batches: int = 32           # of 512 spans, receiver in-process and over HTTP
    cancel_runs: int = 20            # runs cancelled per agent kind
    runs: int = 1_000_000            # the data set, unless --runs says otherwise

    @classmethod
    def quick(cls) -> Sizes:
        return cls(write_seconds=2.0, point_reads=30, list_reads=10, outcome_reads=5,
                   sse_streams=100, sse_appends=40, dashboard_loads=1, peer_single=10,
                   peer_seconds=3.0, otlp_batches=4, cancel_runs=5, runs=2000)

    @classmethod
    def smoke(cls) -> Sizes:
        """Every part once, at the smallest sizes that still fill each row: a check that the
        bench runs (the test suite's), its figures not comparable with any other run's."""
        return cls(write_seconds=0.5, point_reads=5, list_reads=3, outcome_reads=3,
                   sse_streams=100, sse_appends=10, dashboard_loads=1, peer_single=3,
                   peer_seconds=1.0, otlp_batches=2, cancel_runs=2, runs=500)


# ---- the machine's own speed -----------------------------------------------------------------


def calibration_ms() -> float:
    """CPU milliseconds of a fixed pure-Python workload (canonical JSON and SHA-256 of 2,000
    event-like records, the ledger's per-event work), best of 5.

    The bench's machine may be shared: on a virtual machine the same code and data measured
    2× apart in consecutive runs. This figure, taken at the start and the end of a run, says
    whether the machine itself was slower, so runs on different days can be compared."""
    from agentledger.core.hashing import canonical_json, sha256_hex

    records = [{"type": "message.delta", "data": {"text": f"token {i} ", "index": i},
                "run_id": f"run_{i:026d}", "seq": i} for i in range(2000)]
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for record in records:
            sha256_hex(canonical_json(record))
        best = min(best, time.process_time() - start)
    return round(best * 1000, 2)


# ---- statistics ------------------------------------------------------------------------------


def percentile(samples: list[float], fraction: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_ms(samples: list[float]) -> dict[str, float | None]:
    """p50/p95/p99 in milliseconds of samples in seconds."""
    return {f"p{int(f * 100)}": _ms(percentile(samples, f)) for f in (0.5, 0.95, 0.99)} | {
        "n": len(samples)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def timed(fn: Callable[[], Any], iterations: int, *, warmup: int = 2) -> list[float]:
    """Call ``fn`` ``warmup`` + ``iterations`` times; the durations of the measured calls."""
    for _ in range(warmup):
        fn()
    found = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        found.append(time.perf_counter() - start)
    return found


# ---- result rows -----------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the results table.

    ``project`` and ``raw`` are in ``unit`` (``ops/s`` for throughput, ``ms`` for latency: the
    p95 unless the name says otherwise). ``ratio`` = project / raw for throughput and raw /
    project for latencies, so 1.0 is "as fast as PostgreSQL itself" either way.
    """

    section: str
    name: str
    unit: str
    project: float | None = None
    raw: float | None = None
    ratio: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    target: str = ""
    status: str = ""  # pass | miss | n/a | skipped
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def throughput_ratio(project: float | None, raw: float | None) -> float | None:
    if not project or not raw:
        return None
    return round(project / raw, 3)


def latency_ratio(project: float | None, raw: float | None) -> float | None:
    if not project or not raw:
        return None
    return round(raw / project, 3)


# ---- databases -------------------------------------------------------------------------------


def is_postgres(url: str) -> bool:
    return make_url(normalize_url(url)).get_backend_name() == "postgresql"


def libpq(url: str) -> str:
    """The psycopg (libpq) form of a SQLAlchemy PostgreSQL URL."""
    return make_url(normalize_url(url)).set(drivername="postgresql").render_as_string(
        hide_password=False)


def with_database(url: str, name: str) -> str:
    return make_url(normalize_url(url)).set(database=name).render_as_string(hide_password=False)


def create_pg_database(url: str, *, drop: bool = False) -> None:
    """Create the database of ``url`` (on the same server) unless it exists."""
    import psycopg

    target = make_url(normalize_url(url)).database
    with psycopg.connect(libpq(with_database(url, "postgres")), autocommit=True) as admin:
        if drop:
            admin.execute(f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (target,)).fetchone()
        if not exists:
            admin.execute(f'CREATE DATABASE "{target}"')


def drop_pg_database(url: str) -> None:
    import psycopg

    target = make_url(normalize_url(url)).database
    with psycopg.connect(libpq(with_database(url, "postgres")), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')


# ---- the bench's own agent, tokens, sessions and runs (through ingest) ------------------------


def ensure_bench_agent(db: Database) -> None:
    from agentledger.core.errors import Conflict
    from ingest.agents import AgentDefinition, register_agent

    with db.write() as s:
        try:
            register_agent(s, BENCH_AGENT, AgentDefinition(name="Bench Echo", kind="echo"))
        except Conflict:
            pass


def token(db: Database, owner: str, role: str) -> str:
    from ingest.tokens import create_token

    with db.write() as s:
        return create_token(s, owner_id=owner, role=role)[1]


def new_session(db: Database, owner: str, title: str = "bench") -> str:
    from ingest.sessions import create_session

    with db.write() as s:
        return create_session(s, owner_id=owner, agent_id=BENCH_AGENT, title=title)


def running_runs(db: Database, count: int, *, owner: str, executor: str,
                 lease_seconds: float = 3600) -> list[str]:
    """``count`` runs, each in its own session, claimed (running) by ``executor``."""
    from ingest.leases import claim_run
    from ingest.runs import post_message, request_checksum

    found = []
    for i in range(count):
        session_id = new_session(db, owner, f"bench run {i}")
        with db.write() as s:
            key = f"bench-{time.time_ns()}-{i}"
            body = {"content": f"bench {i}"}
            posted = post_message(
                s, owner_id=owner, session_id=session_id, idempotency_key=key,
                checksum=request_checksum(f"/api/sessions/{session_id}/messages", body),
                content=body["content"])
        with db.write() as s:
            claim_run(s, posted.run_id, executor, lease_seconds=lease_seconds)
        found.append(posted.run_id)
    return found


def complete_runs(db: Database, run_ids: list[str], executor: str) -> None:
    """End the bench's leftover running runs ``succeeded`` (keeps the data set consistent)."""
    from agentledger.core.errors import LedgerError
    from ingest.events import append_events

    for run_id in run_ids:
        try:
            with db.write() as s:
                append_events(s, run_id, [("run.completed", {"content": "bench done"})],
                              executor_instance_id=executor)
        except LedgerError:
            pass


def cancel_left_queued(db: Database, *, owner_prefix: str = "bench-", per_transaction: int = 500) -> int:
    """Cancel the runs the bench's creation phases left queued (no executor runs them), through
    ``ingest.cancel``, so that the next reads (and the next bench run on this database) count
    ended runs from the rollup instead of scanning thousands of live ones. Returns how many."""
    from sqlalchemy import select

    from agentledger.core.schema import AgentRun
    from ingest.cancel import request_cancel

    with db.read(primary=True) as s:
        ids = list(s.execute(select(AgentRun.id).where(
            AgentRun.status == "queued", AgentRun.owner_id.like(f"{owner_prefix}%"))).scalars())
    for start in range(0, len(ids), per_transaction):
        with db.write() as s:
            for run_id in ids[start:start + per_transaction]:
                request_cancel(s, run_id, requested_by="bench")
    return len(ids)


# ---- the server subprocess -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``agentledger serve`` in its own process group, logged to a file; a context manager."""

    def __init__(self, url: str, log_dir: Path, *, worker: bool = False, threads: int = 32,
                 workers: int = 1, concurrency: int = 4, name: str = "serve",
                 env: dict[str, str] | None = None):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}-{self.port}.log"
        self.workers = workers
        args = [sys.executable, "-m", "agentledger.cli", "serve", "--host", "127.0.0.1",
                "--port", str(self.port), "--threads", str(threads), "--workers", str(workers),
                "--concurrency", str(concurrency)]
        if not worker:
            args.append("--no-worker")
        environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
        environment.update({
            "AGENTLEDGER_DATABASE_URL": url,
            "AGENTLEDGER_SECRET_KEY": "agentledger-bench-secret",
            "AGENTLEDGER_RUN_RATE_LIMIT": "0",
            "PYTHONUNBUFFERED": "1",
            "PYTHONWARNINGS": "ignore",
        })
        environment.update(env or {})
        self._args, self._env, self._cwd = args, environment, log_dir
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen(self._args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self._env, cwd=self._cwd,
                                     start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agentledger serve exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                # Every worker ready, not only the first: a keep-alive connection opened before
                # the others have started stays with the one that took it.
                if requests.get(f"{self.base_url}/api/health", timeout=2).status_code == 200 \
                        and self.ready_workers() >= self.workers:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"agentledger serve did not answer:\n{self.log_path.read_text()[-3000:]}")

    def ready_workers(self) -> int:
        from agentledger.server import ready_workers

        return ready_workers(self.log_path.read_text(errors="replace"))

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, grace=20)
        self._log.close()

    def cpu_seconds(self) -> float:
        """User + system CPU so far of every process of this server (gunicorn master and
        workers, in-process executor and reconciler threads): its process group."""
        assert self.proc is not None
        return process_group_cpu_seconds(self.proc.pid)


@dataclass(frozen=True)
class ProcessCpu:
    """One live process's ``/proc/<pid>/stat`` figures, in seconds."""

    pid: int
    name: str
    parent: int
    group: int
    own: float       # user + system
    children: float  # user + system of its children that have exited and been waited for
    zombie: bool = False  # exited, not yet waited for: its time is in neither figure


def live_processes() -> Iterator[ProcessCpu]:
    """Every live process (Linux ``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # the process ended meanwhile
            continue
        # "pid (comm) state ppid pgrp … utime stime cutime cstime": after the ")", pgrp is
        # field 2 and the times are fields 11-14 (comm may itself hold spaces and parentheses)
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        yield ProcessCpu(int(entry), name, int(fields[1]), int(fields[2]),
                         (int(fields[11]) + int(fields[12])) / ticks,
                         (int(fields[13]) + int(fields[14])) / ticks, fields[0] == "Z")


def postgres_server_cpu_seconds(url: str) -> float | None:
    """CPU seconds so far of the PostgreSQL server behind ``url``: its postmaster, its live
    backends and background processes, and the ones that have exited (the postmaster has waited
    for them, so they are in its children's time). None when the server is not on this machine.

    Only this server's processes count: other clusters on the machine (a test's temporary
    primary and standby, say) start and stop during a measurement, and their processes' CPU
    would vanish from a machine-wide sum when they exit."""
    if not is_postgres(url) or make_url(normalize_url(url)).host not in (
            None, "", "localhost", "127.0.0.1", "::1"):
        return None
    import psycopg

    with psycopg.connect(libpq(url), autocommit=True) as conn:
        (backend,) = conn.execute("SELECT pg_backend_pid()").fetchone() or (None,)
        # Read while the backend is alive: its parent is the postmaster.
        processes = list(live_processes())
        postmaster = next((p.parent for p in processes if p.pid == backend), None)
        if postmaster is None:  # the server runs in another PID namespace (a container)
            return None
        # A backend that has just exited (the load's own, closed a moment ago) shows its CPU
        # nowhere while it is a zombie, nor when the postmaster (read first) waits for it
        # before its own entry is read: take two readings in a row that agree on the
        # postmaster's children and their time, with no zombie among them.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            again = list(live_processes())
            if _server_view(again, postmaster) == _server_view(processes, postmaster) and not any(
                    p.zombie and p.parent == postmaster for p in again):
                break
            processes = again
            time.sleep(0.01)
    return sum(p.own + p.children if p.pid == postmaster else p.own
               for p in processes if postmaster in (p.pid, p.parent))


def _server_view(processes: list[ProcessCpu], postmaster: int) -> tuple:
    """The postmaster's live children and the time of those it has waited for."""
    return (frozenset(p.pid for p in processes if p.parent == postmaster),
            next((p.children for p in processes if p.pid == postmaster), None))


def process_group_cpu_seconds(pgid: int) -> float:
    """CPU seconds of the live processes in process group ``pgid``."""
    return sum(p.own for p in live_processes() if p.group == pgid)


def stop_process_group(proc: subprocess.Popen, *, grace: float) -> None:
    """SIGTERM the process's group, SIGKILL it if it has not exited after ``grace`` seconds."""
    import signal

    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def http_session(token_value: str | None = None) -> requests.Session:
    s = requests.Session()
    if token_value:
        s.headers["Authorization"] = f"Bearer {token_value}"
    return s


class LeanHTTP:
    """One keep-alive HTTP/1.1 connection on the standard library's ``http.client``: the write
    throughput clients.

    The clients share this machine's cores with the server they measure, so the client's own CPU
    shows up as server slowness. Measured here (4 threads against a no-op Flask route under the
    same gunicorn): ``requests.Session`` costs 0.9 ms of client CPU per request and tops out at
    950 requests/s, this costs 0.2 ms and reaches 2,750. The raw baseline's clients are psycopg
    (libpq in C), so a lean client on the HTTP side is what makes the ratio compare the server's
    work with the database's.
    """

    def __init__(self, base_url: str, token_value: str | None = None):
        parsed = urlsplit(base_url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token_value:
            self.headers["Authorization"] = f"Bearer {token_value}"
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None
             ) -> tuple[int, bytes]:
        """POST ``body`` as JSON; the status and the whole response body."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            self.conn.connect()
            # http.client sends a large body apart from its headers: without this, Nagle's
            # algorithm meets the server's delayed ACK and each such request waits ~40 ms.
            self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.conn.request("POST", path, body=json.dumps(body).encode(),
                              headers={**self.headers, **headers} if headers else self.headers)
            reply = self.conn.getresponse()
            return reply.status, reply.read()
        except Exception:
            # A broken keep-alive connection: the next request opens a new one.
            self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
