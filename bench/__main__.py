"""``python -m bench --db URL --runs N [--quick | --smoke] [--skip-peer] [--reload] [--out DIR]``."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.engine import make_url

from agentledger.core.database import Database, normalize_url
from agentledger.core.migrate import upgrade
from bench import cancel, dashboards, dataset, http_load, otlp, peer_langgraph, reads, report, sse
from bench.common import (
    Row,
    Server,
    Sizes,
    calibration_ms,
    ensure_bench_agent,
    is_postgres,
    log,
    token,
    with_database,
)

DEFAULT_DB = "postgresql+psycopg://postgres@127.0.0.1:5432/agentledger_bench"
SERVER_THREADS = 160  # 100 SSE streams hold one thread each


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--db", default=DEFAULT_DB, help=f"database URL (default {DEFAULT_DB})")
    p.add_argument("--runs", type=int, default=None,
                   help="runs in the data set (default 1,000,000; 2,000 with --quick, 500 with --smoke)")
    p.add_argument("--quick", action="store_true", help="small sizes: the whole suite in < 3 min")
    p.add_argument("--smoke", action="store_true",
                   help="the smallest sizes (500 runs, sub-second phases): checks that every part "
                        "runs; its figures are not comparable with a quick or full run's")
    p.add_argument("--skip-peer", action="store_true", help="do not run LangGraph (the peer)")
    p.add_argument("--reload", action="store_true",
                   help="drop and reload the data set even if the database holds enough runs")
    p.add_argument("--server-workers", type=int, default=os.cpu_count() or 1,
                   help="gunicorn worker processes of the measured `agentledger serve` "
                        "(default: one per CPU, the deployment the README recommends)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"),
                   help="where results go (default bench/results)")
    return p.parse_args(argv)


def _guarded(rows: list[Row], section: str, name: str, fn) -> None:
    """Run one part; a failure becomes an ``error`` row instead of ending the whole bench."""
    try:
        rows.extend(fn())
    except Exception as exc:  # noqa: BLE001 - reported in the results
        traceback.print_exc()
        rows.append(Row(section, name, "", status="error", note=f"{type(exc).__name__}: {exc}"))


LOAD_GOAL = 50_000  # events/s: batches prepared in other processes, COPY in one


def _load_row(load: dataset.LoadResult) -> Row:
    if load.reused:
        return Row("load", "bulk import / demo seed (events/s)", "events/s", target=f"≥ {LOAD_GOAL:,} events/s",
                   status="n/a", note="data set reused: load not measured (use --reload)",
                   detail={"path": load.path})
    eps = load.events_per_second
    importer_us, database_us = load.cpu_us_per_event()
    cpu = (f"; CPU per event: importer {importer_us} µs (this process and its workers), "
           f"PostgreSQL {database_us} µs, on {os.cpu_count()} CPUs"
           if importer_us is not None and database_us is not None else "")
    return Row("load", "bulk import / demo seed (events/s)", "events/s", eps, None, None,
               {"path": load.path, "seconds": round(load.seconds, 1), "runs_per_s": load.runs_per_second,
                "rows_per_s": load.rows_per_second, "runs_added": load.runs_added,
                "events_added": load.events_added, "importer_cpu_us_per_event": importer_us,
                "postgres_cpu_us_per_event": database_us},
               f"≥ {LOAD_GOAL:,} events/s", "pass" if eps and eps >= LOAD_GOAL else "miss",
               f"{load.runs_per_second} runs/s, {load.rows_per_second} rows/s (all tables); "
               f"path: {load.path}{cpu}")


def _sse_sqlite(workdir: Path, sizes: Sizes) -> list[Row]:
    url = f"sqlite:///{workdir / 'sse.db'}"
    upgrade(url)
    db = Database(url)
    try:
        ensure_bench_agent(db)
        viewer = token(db, "bench-viewer", "viewer")
        with Server(url, workdir, threads=SERVER_THREADS, name="serve-sqlite") as srv:
            return [sse.measure(db, srv.port, viewer, "SQLite", sizes, "", None)]
    finally:
        db.dispose()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.quick and args.smoke:
        raise SystemExit("--quick and --smoke are two sizes: choose one")
    url = normalize_url(args.db)
    sizes = Sizes.smoke() if args.smoke else Sizes.quick() if args.quick else Sizes()
    runs = args.runs or sizes.runs
    pg = is_postgres(url)
    started = time.perf_counter()
    started_at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    workdir = Path(tempfile.mkdtemp(prefix="agentledger-bench-"))
    log(f"logs and scratch files in {workdir}")
    calibration_at_start = calibration_ms()

    load = dataset.ensure(url, runs, reload=args.reload)
    # Every run starts from the state autovacuum keeps a database in: fresh statistics and no
    # dead rows. After a load that is needed anyway; on a reused data set it clears what the
    # previous runs' writes left, which matters where autovacuum is off (a CI-tuned server):
    # the outcome rollup rows are updated at every run's end, and without vacuum the day
    # rollup's 778 rows once sat in 86 MB, making a 30-day outcome read 6 times slower.
    dataset.analyze(url)
    rows: list[Row] = [_load_row(load)]
    db = Database(url)
    try:
        ensure_bench_agent(db)
        viewer = token(db, "bench-viewer", "viewer")
        picked = reads.sample(db, 1)
        with Server(url, workdir, threads=SERVER_THREADS, workers=args.server_workers) as srv:
            _guarded(rows, "reads", "reads", lambda: reads.run(db, srv.base_url, viewer, pg, sizes))
            _guarded(rows, "dashboards", "dashboards", lambda: dashboards.measure(
                srv.base_url, viewer, dashboards.page_paths(picked.messages[0], picked.trees[0]),
                sizes))
            _guarded(rows, "writes", "run creation",
                     lambda: http_load.run_creation(db, srv.base_url, pg, sizes))
            _guarded(rows, "writes", "event appends",
                     lambda: http_load.appends(db, srv.base_url, pg, sizes))
            executor = token(db, "bench-otlp", "executor")
            _guarded(rows, "otlp", "OTLP over HTTP", lambda: [otlp.http_row(
                srv.base_url, executor, sizes.otlp_batches, args.server_workers)])
            if pg:
                _guarded(rows, "sse", "SSE PostgreSQL", lambda: [sse.measure(
                    db, srv.port, viewer, "PostgreSQL", sizes, "p50 ≤ 50 ms, p99 ≤ 250 ms",
                    (50.0, 250.0))])
            else:
                rows.append(Row("sse", f"SSE append → client, PostgreSQL, {sizes.sse_streams} "
                                "streams (p50 / p99)", "ms p50", target="p50 ≤ 50 ms, p99 ≤ 250 ms",
                                status="n/a", note="needs a PostgreSQL --db"))
    finally:
        db.dispose()
    _guarded(rows, "sse", "SSE SQLite", lambda: _sse_sqlite(workdir, sizes))
    # In-process, on the bench database: a few seconds, so --quick keeps it (with fewer batches).
    _guarded(rows, "otlp", "OTLP receiver",
             lambda: otlp.rows(url, sizes.otlp_batches))
    # On a database of its own (dropped afterwards): its runs must not join the data set's.
    cancel_url = (with_database(url, f"{make_url(url).database}_cancel") if pg
                  else f"sqlite:///{workdir / 'cancel.db'}")
    _guarded(rows, "cancel", "cancel latency",
             lambda: cancel.rows(cancel_url, workdir, sizes.cancel_runs, drop_after=pg))
    _guarded(rows, "peer", "peer comparison",
             lambda: peer_langgraph.run(url, workdir, sizes, skip_peer=args.skip_peer,
                                        workers=args.server_workers))

    result = {
        "started_at": started_at,
        "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": {**report.machine_info(url),
                    "calibration_ms": [calibration_at_start, calibration_ms()]},
        "config": {"quick": args.quick, "smoke": args.smoke, "runs_requested": runs,
                   "skip_peer": args.skip_peer,
                   "server_workers": args.server_workers,
                   "sizes": sizes.__dict__},
        "load": {"reused": load.reused, "path": load.path, "seconds": load.seconds,
                 "runs": load.runs, "events": load.events},
        "rows": report.rows_as_dicts(rows),
    }
    md, js = report.write(result, Path(args.out))
    print(md.read_text())
    log(f"results: {md} and {js}")
    errors = [r for r in rows if r.status == "error"]
    if errors:
        log(f"{len(errors)} part(s) failed; logs kept in {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
