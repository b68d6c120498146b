"""OTLP receiver throughput: ``python -m bench.otlp [--db URL] [--batches N]``.

Measures the receiver's decode-and-write path in-process (``decode_export`` + ``receive_spans``,
what ``POST /api/otel/v1/traces`` runs after authentication), in protobuf batches of 512 spans:
64 traces of 8 spans each (one agent span, 4 model spans, 3 tool spans), so every batch also
writes 64 runs. Then the same batches again: the cost of a duplicate export (nothing new is
written). Not part of ``python -m bench``'s default suite.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from agentledger.core.database import Database
from agentledger.core.migrate import upgrade
from ingest.otlp import decode_export, receive_spans
from ingest.otlp.wire import spans_of

BATCH = 512
PER_TRACE = 8


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.otlp", description=__doc__)
    p.add_argument("--db", default=None, help="database URL (default: a fresh SQLite file)")
    p.add_argument("--batches", type=int, default=10)
    args = p.parse_args(argv)
    url = args.db or f"sqlite:///{tempfile.mkdtemp()}/otlp-bench.db"
    upgrade(url)
    db = Database(url)
    try:
        bodies = [batch_body(n) for n in range(args.batches)]
        started = time.perf_counter()
        runs = 0
        for body in bodies:
            runs += _send(db, body).runs_written
        fresh = time.perf_counter() - started
        started = time.perf_counter()
        for body in bodies:
            outcome = _send(db, body)
            assert outcome.new == 0 and outcome.runs_written == 0
        again = time.perf_counter() - started
    finally:
        db.dispose()
    spans = BATCH * args.batches
    print(f"database: {db.engine.dialect.name}; {args.batches} batches of {BATCH} spans "
          f"({runs} runs written)")
    print(f"new spans:       {spans / fresh:,.0f} spans/s ({fresh / args.batches * 1000:.0f} ms per batch)")
    print(f"duplicate export: {spans / again:,.0f} spans/s ({again / args.batches * 1000:.0f} ms per batch, nothing written)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
