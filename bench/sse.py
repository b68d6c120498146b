"""SSE: time from an append's commit to the event's arrival on an open stream.

N runs are claimed by the bench (one session each) and one ``text/event-stream`` is opened on
each (N = 100), against the server subprocess. The bench process then appends one
``message.delta`` at a time through ``ingest.events.append_events`` (the executors' write path),
round robin over the runs, every 20 ms; ``t_commit`` is ``perf_counter()`` right after the write
transaction commits, ``t_seen`` the ``perf_counter()`` of the reader thread when the frame's
``data:`` line arrives. Latency = t_seen − t_commit (same clock, same process). The server learns
of the commit through PostgreSQL ``LISTEN/NOTIFY``, or on SQLite through its
``PRAGMA data_version`` watcher.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

from agentledger.core.database import Database
from bench.common import Row, Sizes, complete_runs, latency_ms, log, running_runs

EXECUTOR = "bench-sse"
INTERVAL = 0.02


def _reader(port: int, token: str, run_id: str, after: int, seen: dict[int, float],
            ready: threading.Event, errors: list[str]) -> None:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("GET", f"/api/agent-runs/{run_id}/events", headers={
            "Authorization": f"Bearer {token}", "Accept": "text/event-stream",
            "Last-Event-ID": str(after)})
        reply = conn.getresponse()
        ready.set()
        if reply.status != 200:
            errors.append(f"{run_id}: HTTP {reply.status}")
            return
        while True:
            line = reply.readline()
            if not line:
                return
            if line.startswith(b"data:"):
                now = time.perf_counter()
                event = json.loads(line[5:])
                text = (event.get("data") or {}).get("text", "")
                if text.startswith("sse-"):
                    seen[int(text[4:])] = now
    except Exception as exc:  # noqa: BLE001 - reported
        errors.append(f"{run_id}: {exc!r}")
        ready.set()


def measure(db: Database, port: int, viewer_token: str, label: str, sizes: Sizes,
            target: str, limits: tuple[float, float] | None) -> Row:
    from ingest.events import append_events

    log(f"SSE on {label}: {sizes.sse_streams} streams, {sizes.sse_appends} appends")
    run_ids = running_runs(db, sizes.sse_streams, owner="bench-sse", executor=EXECUTOR)
    with db.read() as s:
        from sqlalchemy import select

        from agentledger.core.schema import AgentRun

        heads = dict(s.execute(select(AgentRun.id, AgentRun.last_event_seq)
                               .where(AgentRun.id.in_(run_ids))).all())
    seen: dict[int, float] = {}
    errors: list[str] = []
    threads = []
    for run_id in run_ids:
        ready = threading.Event()
        t = threading.Thread(target=_reader, args=(port, viewer_token, run_id, heads[run_id],
                                                   seen, ready, errors), daemon=True)
        t.start()
        ready.wait(30)
        threads.append(t)
    time.sleep(0.5)  # every stream is past its first read and waiting
    committed: dict[int, float] = {}
    for k in range(sizes.sse_appends):
        run_id = run_ids[k % len(run_ids)]
        with db.write() as s:
            append_events(s, run_id, [("message.delta", {"text": f"sse-{k}"})],
                          executor_instance_id=EXECUTOR)
        committed[k] = time.perf_counter()
        time.sleep(INTERVAL)
    deadline = time.monotonic() + 5
    while len(seen) < len(committed) and time.monotonic() < deadline:
        time.sleep(0.05)
    complete_runs(db, run_ids, EXECUTOR)  # streams close after the terminal event
    for t in threads:
        t.join(timeout=10)
    latencies = [seen[k] - committed[k] for k in committed if k in seen]
    stats = latency_ms(latencies)
    missing = len(committed) - len(latencies)
    status = "n/a"
    if limits is not None and latencies:
        status = "pass" if stats["p50"] <= limits[0] and stats["p99"] <= limits[1] else "miss"
    if missing:
        status = "miss" if limits is not None else status
    return Row("sse", f"SSE append → client, {label}, {sizes.sse_streams} streams (p50 / p99)",
               "ms p50", stats["p50"], None, None,
               stats | {"missing": missing, "errors": errors[:5], "streams": len(run_ids)},
               target, status, f"p99 {stats['p99']} ms; {missing} events not delivered")
