"""Where a trivial run's time goes, against a real ``agentledger serve``.

``python -m bench.lifecycle --db URL [--runs N] [--clients N] [--seconds S] [--workers N]``

First one client, one run at a time, as the peer rows of ``python -m bench`` do it (post a
message, then read the run's event stream until the server ends it), each run cut into its
phases by the client's clock and the ledger's own time stamps (one machine, one clock):

- post: the client's ``POST …/messages`` until its ``202``;
- stream open: the ``GET`` of the events until its response headers;
- to queued: the post's start until the stamp of ``run.queued`` (the request read, the caller
  looked up, the run written);
- queue wait: ``run.queued`` → ``run.started`` (the commit, the queue's notification, a claim);
- execution: ``run.started`` → the terminal event (the agent, and its ending's statements up to
  the clock read that stamps them);
- delivery: the terminal event's stamp until the client has read the end of the stream (the
  ending's commit, the stream's notification and read, the response, the client);
- total: the client's post until the end of the stream.

Then ``--clients`` clients do the same at once for ``--seconds``: runs/s; CPU per run of the
server's processes (gunicorn workers with their executors), of PostgreSQL's live backends and
of the clients (this process); the queued and running runs, sampled every 100 ms (runs waiting
while executor slots are free mean the claim loops are what they wait for); and the
PostgreSQL sessions opened meanwhile (a pool that keeps too few connections opens and closes
them all the time). The database is dropped and created again (PostgreSQL) or the file
replaced (SQLite).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

from sqlalchemy import func, select

from agentledger.core.database import Database
from agentledger.core.migrate import upgrade
from agentledger.core.schema import AgentRun, RunEvent
from bench.common import (
    Server,
    create_pg_database,
    ensure_bench_agent,
    is_postgres,
    libpq,
    log,
    postgres_server_cpu_seconds,
    token,
)
from bench.http_load import run_clients
from bench.peer_langgraph import LedgerClient

PHASES = ("post", "stream open", "to queued", "queue wait", "execution", "delivery", "total")
ENDINGS = ("run.completed", "run.failed", "run.cancelled", "run.interrupted")


class TimedClient(LedgerClient):
    """The peer rows' client, with the client-side moments of each run kept."""

    def __init__(self, base: str, user_token: str):
        super().__init__(base, user_token)
        self.timings: list[dict] = []

    def run(self) -> None:
        self.n += 1
        start = time.time()
        posted = self.http.post(f"{self.base}/api/sessions/{self.session}/messages",
                                json={"content": "hi"},
                                headers={"Idempotency-Key": f"life-{self.n}-{time.time_ns()}"})
        answered = time.time()
        if posted.status_code != 202:
            raise RuntimeError(f"{posted.status_code} {posted.text[:200]}")
        with self.http.get(self.base + posted.json()["events_url"], stream=True,
                           headers={"Accept": "text/event-stream"}) as reply:
            opened = time.time()
            seen = b""
            for chunk in reply.iter_content(chunk_size=None):
                seen = (seen + chunk)[-4096:]
        ended = time.time()
        if b"event: run.completed" not in seen:
            raise RuntimeError(f"stream ended without run.completed: {seen[-300:]!r}")
        self.timings.append({"run_id": posted.json()["run_id"], "start": start,
                             "answered": answered, "opened": opened, "ended": ended})


def _stamps(db: Database, run_ids: list[str]) -> dict[str, dict[str, float]]:
    """Each run's ``run.queued``, ``run.started`` and terminal event stamps (epoch seconds)."""
    found: dict[str, dict[str, float]] = {}
    with db.read() as s:
        for run_id, kind, at in s.execute(
                select(RunEvent.run_id, RunEvent.type, RunEvent.created_at)
                .where(RunEvent.run_id.in_(run_ids),
                       RunEvent.type.in_(("run.queued", "run.started", *ENDINGS)))):
            found.setdefault(run_id, {})["end" if kind in ENDINGS else kind] = at.timestamp()
    return found


def phases(db: Database, timings: list[dict]) -> dict[str, list[float]]:
    """Milliseconds of each phase (``PHASES``), one value per run."""
    stamps = _stamps(db, [t["run_id"] for t in timings])
    out: dict[str, list[float]] = {p: [] for p in PHASES}
    for t in timings:
        s = stamps[t["run_id"]]
        for name, begin, end in (("post", t["start"], t["answered"]),
                                 ("stream open", t["answered"], t["opened"]),
                                 ("to queued", t["start"], s["run.queued"]),
                                 ("queue wait", s["run.queued"], s["run.started"]),
                                 ("execution", s["run.started"], s["end"]),
                                 ("delivery", s["end"], t["ended"]),
                                 ("total", t["start"], t["ended"])):
            out[name].append((end - begin) * 1000)
    return out


def _pg_sessions(url: str) -> int | None:
    """Sessions PostgreSQL has opened on this database so far (``pg_stat_database``)."""
    if not is_postgres(url):
        return None
    import psycopg
    from sqlalchemy.engine import make_url

    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s",
                           (make_url(url).database,)).fetchone()
    return None if row is None else int(row[0])


class _QueueSampler:
    """Queued and running runs every 100 ms, on its own connection."""

    def __init__(self, db: Database):
        self.db, self.samples = db, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        query = select(func.count().filter(AgentRun.status == "queued"),
                       func.count().filter(AgentRun.status == "running")
                       ).where(AgentRun.status.in_(("queued", "running")))
        while not self._stop.wait(0.1):
            with self.db.read() as s:
                self.samples.append(tuple(s.execute(query).one()))

    def __enter__(self) -> _QueueSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _fresh(url: str, workdir: Path) -> str:
    if is_postgres(url):
        create_pg_database(url, drop=True)
    else:
        url = f"sqlite:///{workdir / 'lifecycle.db'}"
        Path(workdir / "lifecycle.db").unlink(missing_ok=True)
    upgrade(url)
    return url


def _line(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    return (f"  {name:<12} p50 {statistics.median(ordered):7.2f}  "
            f"p90 {ordered[int(len(ordered) * 0.9)]:7.2f}  max {ordered[-1]:7.2f} ms")


def measure(url: str, workdir: Path, *, runs: int, clients: int, seconds: float,
            workers: int) -> dict:
    url = _fresh(url, workdir)
    db = Database(url)
    try:
        ensure_bench_agent(db)
        user = token(db, "lifecycle-user", "user")
        with Server(url, workdir, worker=True, threads=160, concurrency=10, name="lifecycle",
                    workers=workers) as srv:
            log(f"one client: {runs} runs, one at a time")
            one = TimedClient(srv.base_url, user)
            for _ in range(max(3, runs // 10)):  # warm-up
                one.run()
            one.timings.clear()
            for _ in range(runs):
                one.run()
            single = phases(db, one.timings)
            found: dict = {"single": single}
            if clients:
                log(f"{clients} clients for {seconds:g}s")
                many = [LedgerClient(srv.base_url, user) for _ in range(clients)]
                run_clients([c.run for c in many], min(3.0, seconds))  # warm-up
                sessions, server, pg = _pg_sessions(url), srv.cpu_seconds(), postgres_server_cpu_seconds(url)
                mine = time.process_time()
                with _QueueSampler(db) as sampler:
                    phase = run_clients([c.run for c in many], seconds)
                done, pg_after = max(phase.ops, 1), postgres_server_cpu_seconds(url)
                found["concurrent"] = {
                    "clients": clients, "runs_per_s": phase.rate, "errors": phase.errors,
                    "server_cpu_ms": (srv.cpu_seconds() - server) / done * 1000,
                    "postgres_cpu_ms": None if pg is None or pg_after is None else (pg_after - pg) / done * 1000,
                    "client_cpu_ms": (time.process_time() - mine) / done * 1000,
                    "queued_mean": statistics.mean(q for q, _ in sampler.samples or [(0, 0)]),
                    "running_mean": statistics.mean(r for _, r in sampler.samples or [(0, 0)]),
                    "executor_slots": 10 * workers,
                    "sessions_opened": (None if sessions is None
                                        else (_pg_sessions(url) or 0) - sessions),
                    "latency_p50_ms": statistics.median(phase.latencies) * 1000
                    if phase.latencies else None,
                }
        return found
    finally:
        db.dispose()


def report(found: dict) -> str:
    lines = ["one run at a time:"]
    lines += [_line(name, values) for name, values in found["single"].items()]
    c = found.get("concurrent")
    if c:
        pg = "—" if c["postgres_cpu_ms"] is None else f"{c['postgres_cpu_ms']:.2f} ms"
        opened = "—" if c["sessions_opened"] is None else str(c["sessions_opened"])
        lines += [
            f"{c['clients']} clients at once: {c['runs_per_s']:.1f} runs/s "
            f"({c['errors']} errors), p50 {c['latency_p50_ms']:.0f} ms per run",
            f"  CPU per run: server {c['server_cpu_ms']:.2f} ms, PostgreSQL {pg}, "
            f"clients {c['client_cpu_ms']:.2f} ms",
            f"  runs queued {c['queued_mean']:.1f}, running {c['running_mean']:.1f} "
            f"(of {c['executor_slots']} executor slots), on average",
            f"  PostgreSQL sessions opened meanwhile: {opened}",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lifecycle",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1:5432/agentledger_lifecycle",
                   help="a PostgreSQL URL (that database is dropped and created again), or any "
                        "sqlite URL for a SQLite file in --out")
    p.add_argument("--runs", type=int, default=100, help="runs one at a time (default 100)")
    p.add_argument("--clients", type=int, default=50,
                   help="concurrent clients afterwards (default 50; 0: none)")
    p.add_argument("--seconds", type=float, default=15.0, help="of the concurrent phase")
    p.add_argument("--workers", type=int, default=2, help="gunicorn workers of serve (default 2)")
    p.add_argument("--out", default="/tmp/agentledger-lifecycle",
                   help="server logs (and the SQLite file)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.clients < 0 or args.seconds <= 0 or args.workers < 1:
        p.error("--runs and --workers must be at least 1, --clients at least 0, --seconds > 0")
    workdir = Path(args.out)
    workdir.mkdir(parents=True, exist_ok=True)
    print(report(measure(args.db, workdir, runs=args.runs, clients=args.clients,
                         seconds=args.seconds, workers=args.workers)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
