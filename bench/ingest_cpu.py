"""CPU per write operation of the write path, in-process, beside the raw psycopg baseline.

``python -m bench.ingest_cpu --db URL [--ops N]``

Where the HTTP write rows of ``python -m bench`` spend the server's share: one thread, one
operation after another, through the ``ingest`` functions the routes call (``post_message``,
``append_events``) in ``Database.write()`` transactions, and the same operations as
``bench.baseline``'s minimal psycopg transactions (``RawRunCreator``, ``RawAppender``). Each
line gives this process's CPU time per operation (``time.process_time()``: Python, the driver
and the kernel's share of the socket calls; the database server's own CPU is not in it) and
the wall time per operation, for both, and the ratio of their CPU. A PostgreSQL URL is needed
(the raw baseline speaks psycopg); the database is dropped and created again.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from sqlalchemy import select

from agentledger.core.database import Database
from agentledger.core.schema import ChatSession
from bench.baseline import RawAppender, RawRunCreator
from bench.common import (
    BENCH_AGENT,
    ensure_bench_agent,
    is_postgres,
    libpq,
    log,
    new_session,
)
from bench.dataset import prepare

EXECUTOR = "bench-ingest-cpu"


def per_op(fn: Callable[[int], object], ops: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per call of ``fn`` over ``ops`` calls, after ``ops // 10`` warm-ups."""
    for i in range(max(ops // 10, 5)):
        fn(i)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(ops):
        fn(i)
    return ((time.process_time() - cpu) / ops * 1000, (time.perf_counter() - wall) / ops * 1000)


def _raw_creator(db: Database, owner: str) -> RawRunCreator:
    from ingest.runs import agent_snapshot

    session_id = new_session(db, owner)
    with db.read() as s:
        thread_id = s.execute(select(ChatSession.thread_id)
                              .where(ChatSession.id == session_id)).scalar_one()
        snapshot = agent_snapshot(s, BENCH_AGENT)
    return RawRunCreator(libpq(db.url), owner=owner, session_id=session_id, thread_id=thread_id,
                         agent_id=BENCH_AGENT, snapshot=snapshot)


def _claimed_runs(db: Database, owner: str, count: int) -> list[str]:
    from ingest.leases import claim_runs
    from ingest.runs import post_message

    for i in range(count):
        session_id = new_session(db, owner)
        with db.write() as s:
            post_message(s, owner_id=owner, session_id=session_id,
                         idempotency_key=f"{owner}-{i}-{time.time_ns()}",
                         request=(f"/api/sessions/{session_id}/messages", {"content": str(i)}),
                         content=str(i))
    with db.write() as s:
        return [c.run_id for c in claim_runs(s, EXECUTOR, max_runs=count, lease_seconds=3600,
                                             with_history=False)]


def measure(url: str, ops: int) -> list[tuple[str, tuple[float, float], tuple[float, float]]]:
    from ingest.events import append_events
    from ingest.runs import post_message

    db = Database(url)
    try:
        ensure_bench_agent(db)
        owner = "bench-ingest-cpu"
        session_id = new_session(db, owner)
        path = f"/api/sessions/{session_id}/messages"

        def post(i: int) -> None:
            with db.write() as s:
                post_message(s, owner_id=owner, session_id=session_id,
                             idempotency_key=f"cpu-{i}-{time.time_ns()}",
                             request=(path, {"content": f"bench {i}"}), content=f"bench {i}")

        rows = []
        log(f"run creation: {ops} posts, then {ops} raw")
        creator = _raw_creator(db, "bench-ingest-cpu-raw")
        try:
            rows.append(("run creation", per_op(post, ops), per_op(lambda _: creator.create(), ops)))
        finally:
            creator.close()
        mine = _claimed_runs(db, owner + "-append", 5)
        theirs = _claimed_runs(db, owner + "-append-raw", 5)
        for batch in (1, 100):
            events = [("message.delta", {"text": "x "})] * batch

            def append(i: int, events=events) -> None:
                with db.write() as s:
                    append_events(s, mine[i % len(mine)], events, executor_instance_id=EXECUTOR)

            n = ops if batch == 1 else max(ops // 5, 10)
            log(f"appends of {batch}: {n}, then {n} raw")
            appender = RawAppender(libpq(url), theirs)
            try:
                rows.append((f"append, batch of {batch}", per_op(append, n),
                             per_op(lambda _, a=appender, b=batch: a.append(b), n)))
            finally:
                appender.close()
        return rows
    finally:
        db.dispose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ingest_cpu",
                                description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True, help="PostgreSQL URL of a scratch database")
    p.add_argument("--ops", type=int, default=1000, help="operations per line (default 1000)")
    args = p.parse_args(argv)
    if not is_postgres(args.db):
        raise SystemExit("bench.ingest_cpu compares with raw psycopg: give a PostgreSQL URL")
    prepare(args.db, reload=True)
    rows = measure(args.db, args.ops)
    print("| operation | ingest CPU ms/op | raw CPU ms/op | CPU ratio (ingest / raw) "
          "| ingest wall ms/op | raw wall ms/op |")
    print("|---|---|---|---|---|---|")
    for name, (cpu, wall), (raw_cpu, raw_wall) in rows:
        print(f"| {name} | {cpu:.3f} | {raw_cpu:.3f} | {cpu / raw_cpu:.2f} | {wall:.3f} "
              f"| {raw_wall:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
