"""The peer: LangGraph's local Agent Server vs agentledger on the same trivial workload.

LangGraph: ``langgraph-cli[inmem]`` in its own venv (``bench/.venv-langgraph``, gitignored), a
3-node graph (a → b → c, each appends to a string) in a temporary project, served by
``langgraph dev --no-browser --no-reload --n-jobs-per-worker 10`` (offline, no analytics).
agentledger: ``agentledger serve`` with its in-process worker (one process, ``--concurrency 10``,
matching the peer's one process with 10 jobs) on a separate fresh database (``<db>_peer``,
dropped afterwards), and an ``echo`` agent. ``--skip-peer`` skips LangGraph only: the
agentledger side (and its end-to-end latency target) is always measured.

One run, end to end = create it and read its event stream until the stream ends after the
terminal event: ``POST /api/sessions/{id}/messages`` then ``GET …/events`` (SSE) for agentledger,
``POST /threads/{id}/runs/stream`` for LangGraph. Each client has its own session / thread
(both servers run one run at a time per thread) and a keep-alive HTTP session. Latency at
concurrency 1 over ``peer_single`` runs; runs/s at 10 and 50 clients over ``peer_seconds``.

On PostgreSQL each runs/s phase (and the raw lifecycle) starts after ``VACUUM ANALYZE`` of the
fresh database, as every bench phase starts from the state autovacuum keeps a database in. A
database that has never been analyzed has no statistics: the plans its connections prepare
while its tables are tiny are kept (psycopg prepares a statement after its fifth execution) and
serve a table grown a thousand times. Measured here without it, on a server with autovacuum off:
the event stream's read walked every run of its owner (an index on ``owner_id`` tied with the
primary key on an empty table), and PostgreSQL's CPU per run went from 5.9 to 10.2 ms within a
minute at 50 clients.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from agentledger.core.database import Database
from bench import baseline, dataset
from bench.common import (
    BENCH_AGENT,
    Row,
    Server,
    Sizes,
    create_pg_database,
    drop_pg_database,
    ensure_bench_agent,
    free_port,
    http_session,
    is_postgres,
    latency_ms,
    log,
    stop_process_group,
    token,
    with_database,
)
from bench.http_load import raw_clients, run_clients

VENV = Path(__file__).parent / ".venv-langgraph"
GRAPH = '''
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    text: str


def a(state: State) -> dict:
    return {"text": state["text"] + " a"}


def b(state: State) -> dict:
    return {"text": state["text"] + " b"}


def c(state: State) -> dict:
    return {"text": state["text"] + " c"}


builder = StateGraph(State)
for name, fn in (("a", a), ("b", b), ("c", c)):
    builder.add_node(name, fn)
builder.add_edge(START, "a")
builder.add_edge("a", "b")
builder.add_edge("b", "c")
builder.add_edge("c", END)
graph = builder.compile()
'''
CONFIG = '{"dependencies": ["."], "graphs": {"agent": "./graph.py:graph"}}\n'
CONCURRENCY = (10, 50)
# The goals (bench/results/latest.md says which pass).
P50_GOAL_MS = 20.0       # one trivial run end to end, concurrency 1
PEER_GOAL = 3.0          # runs/s at the highest concurrency, × LangGraph's dev server
CPU_GOAL_MS = 8.0        # server CPU per trivial run at the highest concurrency
RAW_GOAL = 0.3           # runs/s at the highest concurrency, × the raw-SQL lifecycle


class Unavailable(Exception):
    pass


def _install() -> Path:
    cli = VENV / "bin" / "langgraph"
    if cli.exists():
        return cli
    log(f"installing langgraph-cli[inmem] into {VENV}")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "langgraph-cli[inmem]"],
                       check=True, capture_output=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise Unavailable(f"could not install langgraph-cli[inmem]: {exc} "
                          f"{detail.decode(errors='replace')[-500:]}") from exc
    if not cli.exists():
        raise Unavailable("langgraph-cli installed no `langgraph` command")
    return cli


class LangGraphServer:
    def __init__(self, cli: Path, workdir: Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.project = workdir / "lg-project"
        self.project.mkdir(exist_ok=True)
        (self.project / "graph.py").write_text(GRAPH)
        (self.project / "langgraph.json").write_text(CONFIG)
        self.log_path = workdir / f"langgraph-{self.port}.log"
        self.cli = cli

    def __enter__(self) -> LangGraphServer:
        env = dict(os.environ, LANGGRAPH_CLI_NO_ANALYTICS="1", PYTHONUNBUFFERED="1")
        env.pop("VIRTUAL_ENV", None)
        env["PATH"] = f"{self.cli.parent}:{env.get('PATH', '')}"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen(
            [str(self.cli), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1",
             "--port", str(self.port), "--n-jobs-per-worker", "10"],
            cwd=self.project, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.__exit__()
                raise Unavailable("langgraph dev exited: " + self.log_path.read_text()[-800:])
            try:
                if requests.get(f"{self.base_url}/ok", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.25)
        self.__exit__()
        raise Unavailable("langgraph dev did not answer /ok within 120 s")

    def __exit__(self, *exc) -> None:
        stop_process_group(self.proc, grace=15)
        self._log.close()


# ---- one client of each ----------------------------------------------------------------------


def _drain(reply: requests.Response, marker: bytes) -> None:
    seen = b""
    for chunk in reply.iter_content(chunk_size=None):
        seen = (seen + chunk)[-4096:]
    if reply.status_code != 200 or marker not in seen:
        raise RuntimeError(f"stream ended without {marker!r}: {reply.status_code} {seen[-300:]!r}")


class LangGraphClient:
    def __init__(self, base: str):
        self.base, self.http = base, requests.Session()
        self.thread = self.http.post(f"{base}/threads", json={}).json()["thread_id"]

    def run(self) -> None:
        with self.http.post(f"{self.base}/threads/{self.thread}/runs/stream", stream=True, json={
            "assistant_id": "agent", "input": {"text": "hi"}, "stream_mode": ["values"],
        }) as reply:
            _drain(reply, b"hi a b c")


class LedgerClient:
    def __init__(self, base: str, user_token: str):
        self.base, self.http = base, http_session(user_token)
        self.session = self.http.post(f"{base}/api/sessions", json={"agent_id": BENCH_AGENT}).json()["id"]
        self.n = 0

    def run(self) -> None:
        self.n += 1
        posted = self.http.post(f"{self.base}/api/sessions/{self.session}/messages",
                                json={"content": "hi"},
                                headers={"Idempotency-Key": f"peer-{self.n}-{time.time_ns()}"})
        if posted.status_code != 202:
            raise RuntimeError(f"{posted.status_code} {posted.text[:200]}")
        with self.http.get(self.base + posted.json()["events_url"], stream=True,
                           headers={"Accept": "text/event-stream"}) as reply:
            _drain(reply, b"event: run.completed")


def _measure(label: str, make_client, sizes: Sizes, cpu_seconds=None, settle=None) -> dict:
    """Latency at concurrency 1, runs/s at each of ``CONCURRENCY``; with ``cpu_seconds`` (the
    server's CPU so far), the server's CPU per run at each concurrency too; ``settle`` runs
    before each runs/s phase (the database's vacuum and statistics)."""
    log(f"peer workload on {label}: {sizes.peer_single} runs at concurrency 1")
    client = make_client()
    samples = []
    client.run()  # warm-up
    for _ in range(sizes.peer_single):
        start = time.perf_counter()
        client.run()
        samples.append(time.perf_counter() - start)
    found = {"latency_ms": latency_ms(samples)}
    for n in CONCURRENCY:
        log(f"peer workload on {label}: {n} clients for {sizes.peer_seconds}s")
        clients = [make_client() for _ in range(n)]
        if settle is not None:
            settle()
        cpu_before = cpu_seconds() if cpu_seconds else None
        phase = run_clients([c.run for c in clients], sizes.peer_seconds)
        if cpu_seconds and phase.ops:
            found[f"cpu_ms_per_run_{n}"] = round((cpu_seconds() - cpu_before) / phase.ops * 1000, 2)
        found[f"runs_per_s_{n}"] = phase.rate
        found[f"errors_{n}"] = phase.errors
        found[f"latency_ms_{n}"] = latency_ms(phase.latencies)
    return found


def run(url: str, workdir: Path, sizes: Sizes, *, skip_peer: bool = False,
        workers: int = 1) -> list[Row]:
    """Both sides; the LangGraph side is skipped (with the reason in the rows) when asked or
    when it cannot be installed or started. The agentledger side always runs."""
    names = ["one run end to end, concurrency 1 (p50)", "one run end to end, concurrency 1 (p95)",
             *(f"trivial runs/s, concurrency {n}" for n in CONCURRENCY)]
    peer, reason = None, "--skip-peer"
    try:
        if skip_peer:
            raise Unavailable("--skip-peer")
        cli = _install()
        scratch = Path(tempfile.mkdtemp(prefix="lg-", dir=workdir))
        try:
            with LangGraphServer(cli, scratch) as lg:
                peer = _measure("LangGraph dev server", lambda: LangGraphClient(lg.base_url), sizes)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    except Unavailable as exc:
        log(f"peer comparison skipped: {exc}")
        reason = str(exc)
    ledger = _ledger(url, workdir, sizes, workers)
    rows = []
    for name in names:
        if "p50" in name or "p95" in name:
            key = "p50" if "p50" in name else "p95"
            mine, theirs = ledger["latency_ms"][key], peer["latency_ms"][key] if peer else None
            target = f"p50 ≤ {P50_GOAL_MS:g} ms" if key == "p50" else ""
            status = ("pass" if mine <= P50_GOAL_MS else "miss") if key == "p50" else "n/a"
            rows.append(Row("peer", name, "ms", mine, theirs,
                            round(theirs / mine, 2) if theirs and mine else None,
                            {"agentledger": ledger["latency_ms"],
                             "langgraph": peer["latency_ms"] if peer else None},
                            target, status, "raw = LangGraph dev server; ratio = LangGraph / agentledger"
                            if peer else f"peer skipped: {reason}"))
        else:
            n = int(name.rsplit(" ", 1)[1])
            mine = ledger[f"runs_per_s_{n}"]
            theirs = peer[f"runs_per_s_{n}"] if peer else None
            ratio = round(mine / theirs, 2) if theirs else None
            target, status = "", "n/a"
            note = ("raw = LangGraph dev server; ratio = agentledger / LangGraph" if peer
                    else f"peer skipped: {reason}")
            if n == CONCURRENCY[-1]:
                target = f"≥ {PEER_GOAL:g} × LangGraph"
                status = ("pass" if ratio >= PEER_GOAL else "miss") if ratio is not None else "skipped"
                floor = ledger.get(f"raw_runs_per_s_{n}")
                if theirs and floor and floor < PEER_GOAL * theirs:
                    # Say so when the goal is beyond the database itself on this machine.
                    note += (f"; {PEER_GOAL:g} × LangGraph = {PEER_GOAL * theirs:,.0f} runs/s is "
                             f"more than the raw SQL lifecycle does here ({floor:,.0f} runs/s, "
                             "row below)")
            rows.append(Row("peer", name, "runs/s", mine, theirs, ratio,
                            {"agentledger_errors": ledger[f"errors_{n}"],
                             "langgraph_errors": peer[f"errors_{n}"] if peer else None,
                             "agentledger_latency_ms": ledger[f"latency_ms_{n}"],
                             "langgraph_latency_ms": peer[f"latency_ms_{n}"] if peer else None},
                            target, status, note))
    n = CONCURRENCY[-1]
    cpu = ledger.get(f"cpu_ms_per_run_{n}")
    rows.append(Row("peer", f"server CPU per trivial run, concurrency {n} (ms)", "ms", cpu, None,
                    None, {f"cpu_ms_per_run_{c}": ledger.get(f"cpu_ms_per_run_{c}")
                           for c in CONCURRENCY},
                    f"≤ {CPU_GOAL_MS:g} ms", "n/a" if cpu is None else
                    ("pass" if cpu <= CPU_GOAL_MS else "miss"),
                    "user + system CPU of the serve process group (gunicorn workers with their "
                    "in-process executor and reconciler) / runs completed; "
                    + ("PostgreSQL's own CPU is not in it" if is_postgres(url) else
                       "SQLite's work is in it (it runs in the serve process)")))
    raw = ledger.get(f"raw_runs_per_s_{n}")
    mine = ledger[f"runs_per_s_{n}"]
    ratio = round(mine / raw, 2) if raw else None
    rows.append(Row("peer", f"trivial lifecycle vs raw SQL, concurrency {n} (runs/s)", "runs/s",
                    mine, raw, ratio, {}, f"≥ {RAW_GOAL:g} × raw",
                    "n/a" if ratio is None else ("pass" if ratio >= RAW_GOAL else "miss"),
                    "raw = bench.baseline.RawLifecycle: the run's whole life as minimal psycopg "
                    "statements (create with message and run.queued, claim, delta, complete "
                    "with answer and rollups), 4 transactions, no HTTP" if raw else
                    "needs a PostgreSQL --db"))
    return rows


def _ledger(url: str, workdir: Path, sizes: Sizes, workers: int) -> dict:
    """agentledger (``serve`` with its in-process executor, ``workers`` gunicorn processes)
    on a fresh database beside the bench's."""
    from agentledger.core.migrate import upgrade

    if is_postgres(url):
        from sqlalchemy.engine import make_url

        peer_url = with_database(url, f"{make_url(url).database}_peer")
        create_pg_database(peer_url, drop=True)
    else:
        peer_url = f"sqlite:///{workdir / 'peer.db'}"
        Path(workdir / "peer.db").unlink(missing_ok=True)
    upgrade(peer_url)
    db = Database(peer_url)
    try:
        ensure_bench_agent(db)
        user = token(db, "peer-user", "user")
        with Server(peer_url, workdir, worker=True, threads=160, concurrency=10, name="peer", workers=workers) as srv:
            found = _measure("agentledger", lambda: LedgerClient(srv.base_url, user), sizes,
                             srv.cpu_seconds, lambda: dataset.analyze(peer_url))
        if is_postgres(url):  # the same lifecycle as minimal SQL, once the server has stopped
            n = CONCURRENCY[-1]
            log(f"trivial lifecycle: {n} raw psycopg clients")
            clients = raw_clients(db, n, baseline.RawLifecycle, "bench-raw-life")
            dataset.analyze(peer_url)
            try:
                found[f"raw_runs_per_s_{n}"] = run_clients([c.live_one for c in clients],
                                                           sizes.peer_seconds).rate
            finally:
                for c in clients:
                    c.close()
        return found
    finally:
        db.dispose()
        if is_postgres(url):
            drop_pg_database(peer_url)
