"""Cancel latency against a real ``agentledger serve``: ``python -m bench.cancel [--db URL]
[--runs N]``, and the ``cancel`` rows of ``python -m bench``.

The contract bounds how long an agent goes on after a cancel: a ``scripted`` agent's sleep
notices it within 1 s, a LangGraph graph and an Agents SDK agent stop within 1 s of
``run.cancelling``. For each agent kind, ``--runs`` runs one after another, each: post a message,
read the run's event stream until the agent's first ``message.delta`` (it is answering, and
would go on for ten minutes), then ``POST /api/agent-runs/{id}/cancel`` and read the stream to
its end, which must be ``run.cancelled``. Measured:

- request: the cancel's ``POST`` until its ``202``;
- stopped (ledger): ``run.cancelling`` → ``run.cancelled`` by the ledger's own stamps (one
  database clock): what the contract bounds;
- stopped (client): the cancel's ``POST`` until the client has read the end of the stream.

The agents (``bench.cancel_agents``): ``scripted`` (one word, then a ten-minute sleep);
``langgraph``, LangChain's own fake chat model streaming 20 tokens a second in a one-node graph;
``openai-agents``, an SDK ``Model`` streaming 20 words a second. The framework kinds run only
where their extras are installed. The server runs its in-process worker
(``serve --concurrency 4``). The database is dropped and created again (PostgreSQL) or the file
replaced (SQLite; the default is a fresh file in a temporary directory).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import requests
from sqlalchemy import select

from agentledger.agent_kinds.storage import langgraph_installed, openai_agents_installed
from agentledger.core.database import Database, normalize_url
from agentledger.core.migrate import upgrade
from agentledger.core.schema import RunEvent
from bench.common import (
    Row,
    create_pg_database,
    drop_pg_database,
    http_session,
    is_postgres,
    log,
    percentile,
    token,
)
from ingest.agents import AgentDefinition, register_agent

REPO = Path(__file__).resolve().parent.parent
BOUND_MS = 1000.0  # the contract's bound: within 1 s of run.cancelling
ENDINGS = (b"run.completed", b"run.failed", b"run.cancelled", b"run.interrupted")
AGENTS = {
    "scripted": {"steps": [{"say": "working"}, {"sleep": 600}]},
    "langgraph": {"graph": "bench.cancel_agents:graph"},
    "openai-agents": {"agent": "bench.cancel_agents:agent"},
}


def kinds_here() -> list[str]:
    """The kinds this machine can run: the framework kinds need their extras."""
    installed = {"scripted": True, "langgraph": langgraph_installed(),
                 "openai-agents": openai_agents_installed()}
    return [kind for kind in AGENTS if installed[kind]]


def fresh_database(url: str) -> None:
    if is_postgres(url):
        create_pg_database(url, drop=True)
    else:
        from agentledger.core.config import sqlite_path

        path = sqlite_path(normalize_url(url))
        if path is not None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
    upgrade(url)


def _events_until(lines, wanted: tuple[bytes, ...]) -> bytes:
    """Read SSE lines until an ``event:`` line names one of ``wanted``; that name."""
    for line in lines:
        if line.startswith(b"event: "):
            name = line[len(b"event: "):].strip()
            if name in wanted:
                return name
    raise RuntimeError(f"the stream ended before any of {wanted}")


def cancel_one(http: requests.Session, base: str, session_id: str, n: int) -> tuple[str, float, float]:
    """One run answered and cancelled: its id, the cancel request's seconds and the seconds
    from the cancel's start until the client read the end of the stream."""
    posted = http.post(f"{base}/api/sessions/{session_id}/messages", json={"content": f"go {n}"},
                       headers={"Idempotency-Key": f"cancel-bench-{n}-{time.time_ns()}"})
    if posted.status_code != 202:
        raise RuntimeError(f"post: {posted.status_code} {posted.text[:200]}")
    run_id = posted.json()["run_id"]
    with http.get(base + posted.json()["events_url"], stream=True, timeout=60,
                  headers={"Accept": "text/event-stream"}) as stream:
        lines = stream.iter_lines()
        seen = _events_until(lines, (b"message.delta", *ENDINGS))
        if seen != b"message.delta":
            raise RuntimeError(f"run {run_id} ended ({seen.decode()}) before it answered")
        started = time.perf_counter()
        reply = http.post(f"{base}/api/agent-runs/{run_id}/cancel")
        requested = time.perf_counter() - started
        if reply.status_code != 202:
            raise RuntimeError(f"cancel: {reply.status_code} {reply.text[:200]}")
        end = _events_until(lines, ENDINGS)
        stopped = time.perf_counter() - started
    if end != b"run.cancelled":
        raise RuntimeError(f"run {run_id} ended {end.decode()}, not run.cancelled")
    return run_id, requested, stopped


def ledger_stop_seconds(db: Database, run_id: str) -> float:
    """``run.cancelling`` → ``run.cancelled`` by the ledger's stamps."""
    with db.read(primary=True) as s:
        stamps = dict(s.execute(select(RunEvent.type, RunEvent.created_at).where(
            RunEvent.run_id == run_id,
            RunEvent.type.in_(("run.cancelling", "run.cancelled")))).all())
    return (stamps["run.cancelled"] - stamps["run.cancelling"]).total_seconds()


def measure(url: str, workdir: Path, runs: int, kinds: list[str], *,
            drop_after: bool = False) -> dict[str, dict]:
    """Per kind: the three figures' samples in ms (``request``, ``ledger``, ``client``); with
    ``drop_after``, the PostgreSQL database is dropped at the end."""
    from bench.common import Server

    fresh_database(url)
    db = Database(url)
    try:
        with db.write() as s:
            for kind in kinds:
                register_agent(s, f"cancel-{kind}", AgentDefinition(
                    name=f"Cancel bench {kind}", kind=kind, params=AGENTS[kind]))
        user = token(db, "bench-cancel", "user")
        found: dict[str, dict] = {}
        with Server(url, workdir, worker=True, name="serve-cancel",
                    env={"PYTHONPATH": str(REPO)}) as server:
            http = http_session(user)
            for kind in kinds:
                log(f"cancel: {runs} runs of kind {kind} on {db.engine.dialect.name}")
                session_id = http.post(f"{server.base_url}/api/sessions",
                                       json={"agent_id": f"cancel-{kind}"}).json()["id"]
                cancel_one(http, server.base_url, session_id, 0)  # warm-up: imports, first connections
                samples: dict[str, list[float]] = {"request": [], "ledger": [], "client": []}
                for n in range(1, runs + 1):
                    run_id, requested, stopped = cancel_one(http, server.base_url, session_id, n)
                    samples["request"].append(requested * 1000)
                    samples["client"].append(stopped * 1000)
                    samples["ledger"].append(ledger_stop_seconds(db, run_id) * 1000)
                found[kind] = samples
        return found
    finally:
        db.dispose()
        if drop_after and is_postgres(url):
            drop_pg_database(url)


def _summary(samples: list[float]) -> dict[str, float | None]:
    return {"p50": _round(percentile(samples, 0.5)), "p95": _round(percentile(samples, 0.95)),
            "max": _round(max(samples, default=None))}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def rows(url: str, workdir: Path, runs: int, *, drop_after: bool = False) -> list[Row]:
    database = "PostgreSQL" if is_postgres(url) else "SQLite"
    found = measure(url, workdir, runs, kinds_here(), drop_after=drop_after)
    out = []
    for kind, samples in found.items():
        ledger, client, request = (_summary(samples[k]) for k in ("ledger", "client", "request"))
        worst = ledger["max"]
        out.append(Row(
            "cancel", f"cancel → run.cancelled, {kind}, {database} (ledger p95)", "ms",
            ledger["p95"], None, None, {"runs": runs, "ledger": ledger, "client": client,
                                        "request": request},
            "every run ≤ 1,000 ms", "pass" if worst is not None and worst <= BOUND_MS else "miss",
            f"{runs} runs; run.cancelling → run.cancelled p50 {ledger['p50']} / max {worst} ms; "
            f"as the client saw it (cancel POST → end of stream) p50 {client['p50']} / p95 "
            f"{client['p95']} ms; the cancel request itself p50 {request['p50']} ms"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cancel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default=None,
                   help="database URL, dropped and created again (default: a fresh SQLite file)")
    p.add_argument("--runs", type=int, default=20, help="runs cancelled per agent kind (default 20)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    workdir = Path(tempfile.mkdtemp(prefix="agentledger-cancel-"))
    url = args.db or f"sqlite:///{workdir / 'cancel.db'}"
    log(f"logs in {workdir}")
    for row in rows(url, workdir, args.runs):
        print(f"{row.name}: {row.project} ms [{row.status}]; {row.note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
