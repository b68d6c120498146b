"""Write throughput: run creation and event appends over HTTP vs the raw psycopg baseline.

Each phase runs N client threads (4 by default) for a fixed time; each thread has its own
keep-alive HTTP connection (``bench.common.LeanHTTP``: a light client, as the clients share the
machine's cores with the server) or its own psycopg connection and does one operation after
another. Throughput = operations completed by all clients / wall time; latency percentiles are
over every operation. The HTTP server is a real ``agentledger serve --no-worker`` subprocess.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentledger.core.database import Database
from bench import baseline
from bench.common import (
    BENCH_AGENT,
    BENCH_EXECUTOR,
    LeanHTTP,
    Row,
    Sizes,
    cancel_left_queued,
    complete_runs,
    http_session,
    latency_ms,
    libpq,
    log,
    new_session,
    throughput_ratio,
)

CLIENTS = 4


@dataclass
class Phase:
    ops: int
    seconds: float
    latencies: list[float]
    errors: int

    @property
    def rate(self) -> float:
        return round(self.ops / self.seconds, 1) if self.seconds else 0.0


def run_clients(workers: list[Callable[[], None]], seconds: float) -> Phase:
    """Each worker (one per client thread) is called in a loop until the time is up."""
    stop = threading.Event()
    counts = [0] * len(workers)
    errors = [0] * len(workers)
    samples: list[list[float]] = [[] for _ in workers]
    barrier = threading.Barrier(len(workers) + 1)

    def loop(i: int) -> None:
        barrier.wait()
        while not stop.is_set():
            start = time.perf_counter()
            try:
                workers[i]()
            except Exception:  # noqa: BLE001 - counted, reported
                errors[i] += 1
                if errors[i] > 50:
                    return
                continue
            samples[i].append(time.perf_counter() - start)
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(workers))]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return Phase(sum(counts), elapsed, [x for s in samples for x in s], sum(errors))


def _row(name: str, project: Phase, raw: Phase | None, target: str, minimum: float | None) -> Row:
    ratio = throughput_ratio(project.rate, raw.rate if raw else None)
    status = "n/a"
    if minimum is not None and ratio is not None:
        status = "pass" if ratio >= minimum else "miss"
    detail = {"project_latency_ms": latency_ms(project.latencies), "project_errors": project.errors}
    if raw:
        detail |= {"raw_latency_ms": latency_ms(raw.latencies), "raw_errors": raw.errors}
    return Row("writes", name, "ops/s", project.rate, raw.rate if raw else None, ratio, detail,
               target, status, "" if raw else "raw baseline is PostgreSQL only")


def run_creation(db: Database, base_url: str, pg: bool, sizes: Sizes) -> list[Row]:
    from bench.common import token

    log(f"run creation: {CLIENTS} HTTP clients for {sizes.write_seconds}s")
    workers = []
    for i in range(CLIENTS):
        owner = f"bench-user-{i}"
        http = LeanHTTP(base_url, token(db, owner, "user"))
        status, body = http.post("/api/sessions", {"agent_id": BENCH_AGENT, "title": "bench"})
        if status != 201:
            raise RuntimeError(f"creating the session: {status} {body[:200]!r}")
        session_id = json.loads(body)["id"]
        counter = iter(range(10**9))

        def post(http=http, session_id=session_id, counter=counter, i=i) -> None:
            n = next(counter)
            status, body = http.post(f"/api/sessions/{session_id}/messages",
                                     {"content": f"bench {n}"},
                                     {"Idempotency-Key": f"bench-{i}-{n}-{time.time_ns()}"})
            if status != 202:
                raise RuntimeError(f"{status} {body[:200]!r}")

        workers.append(post)
    project = run_clients(workers, sizes.write_seconds)
    raw = None
    if pg:
        log(f"run creation: {CLIENTS} raw psycopg clients")
        creators = raw_clients(db, CLIENTS, baseline.RawRunCreator, "bench-raw")
        raw = run_clients([c.create for c in creators], sizes.write_seconds)
        for c in creators:
            c.close()
    log(f"cancelled the {cancel_left_queued(db)} runs the creation phases left queued")
    return [_row(f"run creation, {CLIENTS} clients", project, raw,
                 "≥ 0.35 × raw", 0.35)]


def raw_clients(db: Database, n: int, kind: type[baseline.RawRunCreator], prefix: str) -> list:
    """``n`` raw psycopg clients of ``kind``, each with a session of its own owner."""
    from sqlalchemy import select

    from agentledger.core.schema import ChatSession
    from ingest.runs import agent_snapshot

    clients = []
    for i in range(n):
        owner = f"{prefix}-{i}"
        session_id = new_session(db, owner)
        with db.read() as s:
            thread_id = s.execute(select(ChatSession.thread_id)
                                  .where(ChatSession.id == session_id)).scalar_one()
            snapshot = agent_snapshot(s, BENCH_AGENT)
        clients.append(kind(libpq(db.url), owner=owner, session_id=session_id,
                            thread_id=thread_id, agent_id=BENCH_AGENT, snapshot=snapshot))
    return clients


def _claim(http, base_url: str, count: int) -> list[str]:
    found: list[str] = []
    while len(found) < count:
        reply = http.post(f"{base_url}/api/executor/claim",
                          json={"executor_instance_id": BENCH_EXECUTOR,
                                "max_runs": min(100, count - len(found)), "lease_seconds": 3600})
        reply.raise_for_status()
        runs = [r["run_id"] for r in reply.json()["runs"]]
        if not runs:
            break
        found += runs
    return found


def appends(db: Database, base_url: str, pg: bool, sizes: Sizes) -> list[Row]:
    """Batches of 1 and of 100 ``message.delta`` events, HTTP vs raw; 5 runs per client."""
    from bench.common import token

    per_client = 5
    owner = "bench-appender"
    # Runs to append to: one session each (a thread runs one run at a time), claimed over HTTP.
    from ingest.runs import post_message, request_checksum

    for i in range(CLIENTS * per_client * 2):
        session_id = new_session(db, owner)
        with db.write() as s:
            post_message(s, owner_id=owner, session_id=session_id,
                         idempotency_key=f"append-{time.time_ns()}-{i}",
                         checksum=request_checksum(f"/api/sessions/{session_id}/messages", i),
                         content=f"append target {i}")
    executor_token = token(db, "bench-executor", "executor")
    claimer = http_session(executor_token)
    run_ids = _claim(claimer, base_url, CLIENTS * per_client * 2)
    if len(run_ids) < CLIENTS * 2:
        raise RuntimeError(f"could only claim {len(run_ids)} runs for the append benchmark")
    half = len(run_ids) // 2
    http_runs, raw_runs = run_ids[:half], run_ids[half:]
    rows = []
    for batch in (1, 100):
        log(f"appends, batches of {batch}: {CLIENTS} HTTP clients for {sizes.write_seconds}s")
        workers = []
        for i in range(CLIENTS):
            http = LeanHTTP(base_url, executor_token)
            mine = http_runs[i::CLIENTS]
            turn = iter(range(10**9))

            def append(http=http, mine=mine, turn=turn, batch=batch, i=i) -> None:
                n = next(turn)
                run_id = mine[n % len(mine)]
                # With a key, as ExecutorClient (an --api worker) sends every append.
                status, body = http.post(f"/api/executor/runs/{run_id}/events", {
                    "executor_instance_id": BENCH_EXECUTOR,
                    "events": [{"type": "message.delta", "data": {"text": "x "}}] * batch},
                    {"Idempotency-Key": f"bench-append-{i}-{n}"})
                if status != 200:
                    raise RuntimeError(f"{status} {body[:200]!r}")

            workers.append(append)
        project = run_clients(workers, sizes.write_seconds)
        project.ops *= batch  # events, not requests
        raw = None
        if pg:
            log(f"appends, batches of {batch}: {CLIENTS} raw psycopg clients")
            appenders = [baseline.RawAppender(libpq(db.url), raw_runs[i::CLIENTS])
                         for i in range(CLIENTS)]
            raw = run_clients([lambda a=a, b=batch: a.append(b) for a in appenders],
                              sizes.write_seconds)
            raw.ops *= batch
            for a in appenders:
                a.close()
        target, minimum = ("≥ 0.3 × raw", 0.3) if batch == 1 else ("≥ 0.6 × raw", 0.6)
        row = _row(f"event appends, batches of {batch}, {CLIENTS} clients (events/s)",
                   project, raw, target, minimum)
        row.unit = "events/s"
        rows.append(row)
    complete_runs(db, run_ids, BENCH_EXECUTOR)
    return rows
