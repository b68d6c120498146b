"""OTLP/HTTP bodies in and out: protobuf or OTLP JSON, optionally gzip, decoded with
``opentelemetry-proto`` and ``google.protobuf.json_format`` (never by hand)."""

from __future__ import annotations

import base64
import binascii
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from agentledger.core.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from agentledger.core.json_limits import parse_json_body

MAX_DECODED_BYTES = 16 * 1024 * 1024
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str | None
    service_name: str
    name: str
    start_at: datetime
    end_at: datetime
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str | None
    attributes: dict[str, Any]


def media_type(content_type: str | None) -> str:
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind not in (PROTOBUF, JSON):
        raise UnsupportedMediaType(
            f"Content-Type must be {PROTOBUF} or {JSON}, not {kind or 'missing'!r}")
    return kind


def _inflate(body: bytes, encoding: str | None) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        if len(body) > MAX_DECODED_BYTES:
            raise PayloadTooLarge("the trace export is larger than 16 MiB")
        return body
    if encoding != "gzip":
        raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not supported (gzip is)")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, MAX_DECODED_BYTES + 1)
    except zlib.error as exc:
        raise InvalidRequest(f"the gzip body does not decompress: {exc}") from exc
    if len(out) > MAX_DECODED_BYTES or inflater.unconsumed_tail:
        raise PayloadTooLarge("the trace export is larger than 16 MiB once decompressed")
    if not inflater.eof:
        raise InvalidRequest("the gzip body is truncated")
    return out


def _items(value) -> list:
    return value if isinstance(value, list) else []


def _hex_ids_to_base64(payload: Any) -> None:
    """OTLP JSON spells trace and span ids in hex; protobuf's JSON mapping wants base64. Shapes
    that are not OTLP are left for ``json_format`` to refuse."""
    if not isinstance(payload, dict):
        raise InvalidRequest("an OTLP JSON export is an object")
    for resource_spans in _items(payload.get("resourceSpans")):
        if not isinstance(resource_spans, dict):
            continue
        for scope_spans in _items(resource_spans.get("scopeSpans")):
            if not isinstance(scope_spans, dict):
                continue
            for span in _items(scope_spans.get("spans")):
                if not isinstance(span, dict):
                    continue
                for holder in [span, *_items(span.get("links"))]:
                    if not isinstance(holder, dict):
                        continue
                    for key in ("traceId", "spanId", "parentSpanId"):
                        value = holder.get(key)
                        if isinstance(value, str) and value:
                            try:
                                holder[key] = base64.b64encode(bytes.fromhex(value)).decode()
                            except ValueError as exc:
                                raise InvalidRequest(f"{key} {value[:40]!r} is not hex") from exc


def decode_export(body: bytes, content_type: str | None,
                  encoding: str | None) -> tuple[ExportTraceServiceRequest, str]:
    """The decoded request and its media type; ``InvalidRequest`` for a body that does not decode."""
    kind = media_type(content_type)
    raw = _inflate(body, encoding)
    request = ExportTraceServiceRequest()
    if kind == PROTOBUF:
        try:
            request.ParseFromString(raw)
        except DecodeError as exc:
            raise InvalidRequest(f"the body is not an OTLP protobuf trace export: {exc}") from exc
        return request, kind
    payload = parse_json_body(raw)
    _hex_ids_to_base64(payload)
    try:
        json_format.ParseDict(payload, request, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, binascii.Error) as exc:
        raise InvalidRequest(f"the body is not an OTLP JSON trace export: {exc}") from exc
    return request, kind


def encode_response(kind: str, rejected: int, message: str) -> bytes:
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if kind == PROTOBUF:
        return response.SerializeToString()
    return json_format.MessageToJson(response, indent=None).encode()


def _value(any_value) -> Any:
    which = any_value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(any_value.bytes_value).decode()
    value = getattr(any_value, which)
    if which == "double_value" and value != value:  # NaN is not JSON
        return None
    return value


def _attributes(key_values) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


def _time(nanos: int) -> datetime:
    return _EPOCH + timedelta(microseconds=nanos // 1000)


def spans_of(request: ExportTraceServiceRequest) -> tuple[list[ReceivedSpan], int]:
    """The well-formed spans of an export, and how many were refused (bad ids or times, or a
    span that names itself as its parent)."""
    spans: list[ReceivedSpan] = []
    refused = 0
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name") or "unknown_service")[:200]
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if (len(span.trace_id) != 16 or len(span.span_id) != 8
                        or not any(span.trace_id) or not any(span.span_id)
                        or len(span.parent_span_id) not in (0, 8)
                        or span.parent_span_id == span.span_id
                        or not span.start_time_unix_nano
                        or span.end_time_unix_nano < span.start_time_unix_nano):
                    refused += 1
                    continue
                spans.append(ReceivedSpan(
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex() or None,
                    service_name=service,
                    name=span.name,
                    start_at=_time(span.start_time_unix_nano),
                    end_at=_time(span.end_time_unix_nano),
                    status_code=int(span.status.code),
                    status_message=span.status.message or None,
                    attributes=_attributes(span.attributes),
                ))
    return spans, refused
