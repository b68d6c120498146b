"""The OpenTelemetry (OTLP/HTTP) trace receiver: ``POST /api/otel/v1/traces`` (CONTRACT §8).

The body is an ``ExportTraceServiceRequest`` in protobuf or OTLP JSON (optionally gzip), read
here rather than by a pydantic model; the answer is an ``ExportTraceServiceResponse`` in the
request's encoding. Errors (4xx) are the usual JSON envelope for every client, protobuf ones too.
Mapping and buffering: ``ingest.otlp`` and docs/otlp.md.
"""

from __future__ import annotations

from flask import Response, g, request

from agentledger.api import api
from agentledger.api.request_scope import state
from agentledger.api.responses import OtlpExportResponse
from ingest.otlp import MAX_DECODED_BYTES, decode_export, encode_response, receive_spans
from ingest.otlp.wire import spans_of

EXPORTERS = ("executor", "admin")
_BINARY = {"type": "string", "format": "binary",
           "description": "ExportTraceServiceRequest (opentelemetry-proto)"}
_OTLP_JSON = {"type": "object", "description": "ExportTraceServiceRequest in OTLP JSON "
              "(camelCase fields, hex trace and span ids)"}


@api.route("/otel/v1/traces", "POST", summary="Receive an OTLP/HTTP trace export",
           roles=EXPORTERS, raw_body={"application/x-protobuf": _BINARY,
                                      "application/json": _OTLP_JSON},
           responses={200: OtlpExportResponse},
           extra_content={200: {"application/x-protobuf": {"schema": {
               "type": "string", "format": "binary",
               "description": "ExportTraceServiceResponse (opentelemetry-proto)"}}}},
           errors=(415,), tag="otlp",
           headers={"Content-Encoding": "gzip, or none"})
def otlp_traces():
    # The compressed body may not exceed the decoded limit either; the decoded size is checked
    # while inflating, so a gzip bomb stops at 16 MiB.
    request.max_content_length = MAX_DECODED_BYTES
    body = request.get_data(cache=False)
    export, kind = decode_export(body, request.content_type,
                                 request.headers.get("Content-Encoding"))
    spans, malformed = spans_of(export)
    settings = state().settings
    outcome = receive_spans(state().db, g.principal.owner_id, spans,
                            quiet_seconds=settings.otlp_quiet_seconds,
                            settle_seconds=settings.otlp_settle_seconds)
    rejected = outcome.rejected + malformed
    messages = list(outcome.messages)
    if malformed:
        messages.insert(0, f"{malformed} span(s) without valid trace/span/parent ids "
                                    "or times")
    return Response(encode_response(kind, rejected, "; ".join(dict.fromkeys(messages))),
                    status=200, mimetype=kind)
