"""OTLP receiver throughput: ``python -m bench.otlp [--db URL] [--batches N]``, and the
``otlp`` rows of ``python -m bench``.

Measures the receiver's decode-and-write path in-process (``decode_export`` + ``receive_spans``,
what ``POST /api/otel/v1/traces`` runs after authentication), in protobuf batches of 512 spans:
64 traces of 8 spans each (one agent span, 4 model spans, 3 tool spans), so every batch also
writes 64 runs. Then the same batches again: the cost of a duplicate export (nothing new is
written). The connections are opened before the clock starts (a server's pool is warm).

The raw baseline stores the same span rows with nothing around them: PostgreSQL gets one
``COPY`` per batch into a scratch table shaped like ``otlp_span`` (then, for the duplicate
figure, ``INSERT … SELECT … ON CONFLICT DO NOTHING`` of the same rows from a staging table);
SQLite gets ``executemany`` inserts (``INSERT OR IGNORE`` for the duplicate figure). It is a
floor on the cost of buffering the spans; the receiver also writes the runs, their events, hash
chains, messages and rollups.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from sqlalchemy.engine import make_url

from agentledger.core.database import Database, normalize_url
from agentledger.core.migrate import upgrade
from bench.common import Row, libpq, throughput_ratio
from ingest.otlp import decode_export, receive_spans
from ingest.otlp.wire import spans_of

BATCH = 512
PER_TRACE = 8
TARGET_SPANS_PER_SECOND = 5000


def _kv(key: str, value) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def batch_body(n: int) -> bytes:
    spans = []
    t0 = 1_780_000_000_000_000_000 + n * 10_000_000_000
    for t in range(BATCH // PER_TRACE):
        trace = os.urandom(16)
        root = os.urandom(8)
        spans.append(Span(trace_id=trace, span_id=root, name="invoke_agent bench",
                          start_time_unix_nano=t0, end_time_unix_nano=t0 + 9_000_000,
                          attributes=[_kv("gen_ai.operation.name", "invoke_agent"),
                                      _kv("gen_ai.agent.name", "otlp-bench"),
                                      _kv("input.value", f"question {n}/{t}"),
                                      _kv("output.value", "answer")]))
        for i in range(PER_TRACE - 1):
            attrs = ([_kv("gen_ai.operation.name", "chat"), _kv("gen_ai.request.model", "m"),
                      _kv("gen_ai.usage.input_tokens", 10), _kv("gen_ai.usage.output_tokens", 5)]
                     if i % 2 == 0 else
                     [_kv("gen_ai.operation.name", "execute_tool"), _kv("gen_ai.tool.name", "t"),
                      _kv("gen_ai.tool.call.arguments", '{"x": 1}'),
                      _kv("gen_ai.tool.call.result", "1")])
            spans.append(Span(trace_id=trace, span_id=os.urandom(8), parent_span_id=root,
                              name="child", start_time_unix_nano=t0 + (i + 1) * 1_000_000,
                              end_time_unix_nano=t0 + (i + 1) * 1_000_000 + 500_000,
                              attributes=attrs))
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource={"attributes": [_kv("service.name", "bench")]},
        scope_spans=[ScopeSpans(spans=spans)])])
    return request.SerializeToString()


def _send(db: Database, body: bytes):
    export, _ = decode_export(body, "application/x-protobuf", None)
    spans, _ = spans_of(export)
    return receive_spans(db, "bench", spans)


@dataclass
class Measured:
    database: str
    batches: int
    runs: int
    fresh_seconds: float
    duplicate_seconds: float
    # Spans and runs the duplicate export stored anew: 0 unless re-exporting is broken.
    duplicates_written: int = 0

    @property
    def spans(self) -> int:
        return BATCH * self.batches

    def rate(self, seconds: float) -> float:
        return round(self.spans / seconds, 1) if seconds else 0.0


def measure(url: str, batches: int) -> Measured:
    """The receiver: ``batches`` new batches, then the same batches again."""
    upgrade(url)
    db = Database(url)
    try:
        bodies = [batch_body(n) for n in range(batches)]
        with db.write(), db.read(primary=True):
            pass  # open the pools' connections
        started = time.perf_counter()
        runs = 0
        for body in bodies:
            runs += _send(db, body).runs_written
        fresh = time.perf_counter() - started
        started = time.perf_counter()
        written = 0
        for body in bodies:
            outcome = _send(db, body)
            written += outcome.new + outcome.runs_written
        again = time.perf_counter() - started
    finally:
        db.dispose()
    return Measured(db.engine.dialect.name, batches, runs, fresh, again, written)


def _receiver_process(url: str, first: int, batches: int, barrier, results) -> None:
    """One receiving process (as one gunicorn worker would be): its own pool, its own traces."""
    db = Database(url)
    try:
        bodies = [batch_body(first + n) for n in range(batches)]
        with db.write(), db.read(primary=True):
            pass
        barrier.wait()
        started = time.perf_counter()
        runs = sum(_send(db, body).runs_written for body in bodies)
        results.put((started, time.perf_counter(), runs))
    finally:
        db.dispose()


def measure_parallel(url: str, batches: int, processes: int) -> tuple[int, float, int]:
    """``processes`` receivers at once, ``batches`` new batches each: (spans, wall seconds from
    the first start to the last end, runs written)."""
    import multiprocessing

    upgrade(url)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=_receiver_process,
                           args=(url, 1_000_000 + i * batches, batches, barrier, results))
               for i in range(processes)]
    for w in workers:
        w.start()
    got = [results.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    wall = max(end for _, end, _ in got) - min(start for start, _, _ in got)
    return BATCH * batches * processes, wall, sum(runs for _, _, runs in got)


def measure_http(base_url: str, executor_token: str, batches: int, clients: int,
                 ) -> tuple[int, float]:
    """``clients`` exporters at once against a running ``agentledger serve``, each POSTing its
    own ``batches`` protobuf bodies (built before the clock starts, as an exporter's batch
    processor has them ready): (spans, wall seconds)."""
    from concurrent.futures import ThreadPoolExecutor

    import requests

    bodies = [[batch_body(2_000_000 + c * batches + n) for n in range(batches)]
              for c in range(clients)]
    headers = {"Authorization": f"Bearer {executor_token}",
               "Content-Type": "application/x-protobuf"}

    def export(mine: list[bytes]) -> None:
        with requests.Session() as http:
            http.get(f"{base_url}/api/health", timeout=10)  # a warm keep-alive connection
            barrier.wait()
            for body in mine:
                reply = http.post(f"{base_url}/api/otel/v1/traces", data=body, headers=headers,
                                  timeout=60)
                if reply.status_code != 200 or reply.content:
                    raise RuntimeError(f"OTLP export answered {reply.status_code}: "
                                       f"{reply.content[:200]!r}")

    import threading

    barrier = threading.Barrier(clients + 1)
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(export, mine) for mine in bodies]
        barrier.wait()
        started = time.perf_counter()
        for future in futures:
            future.result()
        wall = time.perf_counter() - started
    return BATCH * batches * clients, wall


def http_row(base_url: str, executor_token: str, batches: int, clients: int) -> Row:
    """The deployment's figure: OTLP/HTTP exports to ``serve`` (one gunicorn worker per CPU),
    as many exporters at once as it has workers."""
    spans, wall = measure_http(base_url, executor_token, batches, clients)
    rate = round(spans / wall, 1)
    return Row("otlp", f"OTLP/HTTP export to serve, {clients} exporters, batches of {BATCH} "
               "(spans/s)", "spans/s", rate, None, None,
               {"clients": clients, "batches_each": batches, "spans": spans,
                "seconds": round(wall, 3)},
               f"≥ {TARGET_SPANS_PER_SECOND:,} spans/s",
               "pass" if rate >= TARGET_SPANS_PER_SECOND else "miss",
               f"{clients} exporters × {batches} protobuf POSTs to /api/otel/v1/traces, "
               f"{BATCH // PER_TRACE} runs written per batch; {spans:,} spans in {wall:.2f} s")


# ---- the raw baseline ------------------------------------------------------------------------

_RAW_COLUMNS = ("trace_id", "span_id", "parent_span_id", "owner_id", "service_name", "name",
                "start_at", "end_at", "status_code", "status_message", "attributes",
                "received_at")


def _raw_rows(body: bytes) -> list[tuple]:
    export, _ = decode_export(body, "application/x-protobuf", None)
    spans, _ = spans_of(export)
    now = datetime.now(UTC)
    return [(s.trace_id, s.span_id, s.parent_span_id, "bench", s.service_name, s.name,
             s.start_at, s.end_at, s.status_code, s.status_message, json.dumps(s.attributes),
             now) for s in spans]


def measure_raw(url: str, batches: int) -> tuple[float, float]:
    """Seconds to store the same span rows with plain driver calls: new, then again (ignored)."""
    bodies = [batch_body(n) for n in range(batches)]
    if make_url(normalize_url(url)).get_backend_name() == "postgresql":
        return _raw_postgres(libpq(url), bodies)
    return _raw_sqlite(make_url(normalize_url(url)).database, bodies)


_RAW_TABLE = ("trace_id text, span_id text, parent_span_id text, owner_id text, "
              "service_name text, name text, start_at timestamptz, end_at timestamptz, "
              "status_code smallint, status_message text, attributes jsonb, "
              "received_at timestamptz, run_id text, PRIMARY KEY (trace_id, span_id)")


def _raw_postgres(dsn: str, bodies: list[bytes]) -> tuple[float, float]:
    columns = ", ".join(_RAW_COLUMNS)
    with psycopg.connect(dsn) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw_otlp_span")
        conn.execute(f"CREATE TABLE bench_raw_otlp_span ({_RAW_TABLE})")
        conn.execute("CREATE INDEX ON bench_raw_otlp_span (received_at)")
        conn.execute("CREATE INDEX ON bench_raw_otlp_span (run_id, received_at)")
        conn.execute(f"CREATE TEMP TABLE bench_raw_stage ({_RAW_TABLE.split(', PRIMARY')[0]})")
        conn.commit()
        try:
            fresh = again = 0.0
            for duplicate in (False, True):
                for body in bodies:
                    rows = _raw_rows(body)
                    started = time.perf_counter()
                    with conn.transaction(), conn.cursor() as cur:
                        target = "bench_raw_stage" if duplicate else "bench_raw_otlp_span"
                        with cur.copy(f"COPY {target} ({columns}) FROM STDIN") as copy:
                            for row in rows:
                                copy.write_row(row)
                        if duplicate:
                            cur.execute(f"INSERT INTO bench_raw_otlp_span ({columns}) "
                                        f"SELECT {columns} FROM bench_raw_stage "
                                        "ON CONFLICT DO NOTHING")
                            cur.execute("TRUNCATE bench_raw_stage")
                    elapsed = time.perf_counter() - started
                    if duplicate:
                        again += elapsed
                    else:
                        fresh += elapsed
        finally:
            conn.rollback()
            conn.execute("DROP TABLE IF EXISTS bench_raw_otlp_span")
            conn.commit()
    return fresh, again


def _raw_sqlite(path: str, bodies: list[bytes]) -> tuple[float, float]:
    columns = ", ".join(_RAW_COLUMNS)
    marks = ", ".join("?" for _ in _RAW_COLUMNS)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("DROP TABLE IF EXISTS bench_raw_otlp_span")
        conn.execute(f"CREATE TABLE bench_raw_otlp_span ({_RAW_TABLE})")
        conn.execute("CREATE INDEX bench_raw_otlp_received ON bench_raw_otlp_span (received_at)")
        conn.execute("CREATE INDEX bench_raw_otlp_run ON bench_raw_otlp_span (run_id, received_at)")
        fresh = again = 0.0
        for verb, duplicate in (("INSERT", False), ("INSERT OR IGNORE", True)):
            for body in bodies:
                rows = [tuple(v.isoformat() if isinstance(v, datetime) else v for v in row)
                        for row in _raw_rows(body)]
                started = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(f"{verb} INTO bench_raw_otlp_span ({columns}) VALUES ({marks})",
                                 rows)
                conn.execute("COMMIT")
                elapsed = time.perf_counter() - started
                if duplicate:
                    again += elapsed
                else:
                    fresh += elapsed
        conn.execute("DROP TABLE bench_raw_otlp_span")
    finally:
        conn.close()
    return fresh, again


def rows(url: str, batches: int) -> list[Row]:
    """The suite's two OTLP rows: new spans and a duplicate export, each against the raw floor."""
    got = measure(url, batches)
    raw_fresh, raw_again = measure_raw(url, batches)
    fresh, again = got.rate(got.fresh_seconds), got.rate(got.duplicate_seconds)
    raw_new, raw_dup = got.rate(raw_fresh), got.rate(raw_again)
    detail = {"batches": batches, "spans_per_batch": BATCH, "runs_written": got.runs,
              "ms_per_batch": round(got.fresh_seconds / batches * 1000, 1),
              "duplicate_ms_per_batch": round(got.duplicate_seconds / batches * 1000, 1)}
    target_met = fresh >= TARGET_SPANS_PER_SECOND
    return [
        Row("otlp", f"OTLP receive, batches of {BATCH} spans (spans/s)", "spans/s", fresh,
            raw_new, throughput_ratio(fresh, raw_new), detail,
            f"≥ {TARGET_SPANS_PER_SECOND:,} spans/s", "pass" if target_met else "miss",
            f"{detail['ms_per_batch']} ms per batch, {BATCH // PER_TRACE} runs written per "
            "batch; raw = the span rows alone (COPY / executemany)"),
        Row("otlp", f"OTLP duplicate export, batches of {BATCH} spans (spans/s)", "spans/s",
            again, raw_dup, throughput_ratio(again, raw_dup), detail, "nothing written",
            "pass" if got.duplicates_written == 0 else "miss",
            f"{detail['duplicate_ms_per_batch']} ms per batch, "
            f"{got.duplicates_written} spans and runs written; raw = the same rows inserted "
            "again, ignoring conflicts"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.otlp", description=__doc__)
    p.add_argument("--db", default=None, help="database URL (default: a fresh SQLite file)")
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--processes", type=int, default=1,
                   help="receiving processes at once (like `serve --workers N`); with more "
                        "than one, the aggregate rate of new spans only")
    p.add_argument("--http", action="store_true",
                   help="export over HTTP to an `agentledger serve --workers PROCESSES` this "
                        "command starts, PROCESSES exporters at once")
    args = p.parse_args(argv)
    url = args.db or f"sqlite:///{tempfile.mkdtemp()}/otlp-bench.db"
    if args.http:
        from pathlib import Path

        from bench.common import Server, token

        upgrade(url)
        db = Database(url)
        try:
            executor = token(db, "otlp-bench", "executor")
        finally:
            db.dispose()
        with Server(url, Path(tempfile.mkdtemp()), workers=args.processes,
                    name="serve-otlp") as srv:
            row = http_row(srv.base_url, executor, args.batches, args.processes)
        print(f"{row.name}: {row.project:,.0f} spans/s ({row.note})")
        return 0
    if args.processes > 1:
        spans, wall, runs = measure_parallel(url, args.batches, args.processes)
        print(f"{args.processes} receiving processes × {args.batches} batches of {BATCH} spans "
              f"({runs} runs written): {spans / wall:,.0f} spans/s in all "
              f"({spans:,} spans in {wall:.2f} s)")
        return 0
    got = measure(url, args.batches)
    print(f"database: {got.database}; {args.batches} batches of {BATCH} spans "
          f"({got.runs} runs written)")
    print(f"new spans:        {got.rate(got.fresh_seconds):,.0f} spans/s "
          f"({got.fresh_seconds / args.batches * 1000:.0f} ms per batch)")
    print(f"duplicate export: {got.rate(got.duplicate_seconds):,.0f} spans/s "
          f"({got.duplicate_seconds / args.batches * 1000:.0f} ms per batch, nothing written)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
