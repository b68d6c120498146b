"""The OTLP/HTTP trace receiver's write path (CONTRACT §8; decisions in docs/otlp.md).

``wire`` turns an ``ExportTraceServiceRequest`` (protobuf or OTLP JSON) into plain spans;
``record`` buffers them in ``otlp_span`` and writes each trace's runs through the bulk importer
(same state machine checks and hash chain as live runs) once their agent spans have arrived.
"""

from ingest.otlp.record import (
    DEFAULT_QUIET_SECONDS,
    ExportOutcome,
    flush_quiet_traces,
    receive_spans,
)
from ingest.otlp.wire import MAX_DECODED_BYTES, ReceivedSpan, decode_export, encode_response

__all__ = [
    "DEFAULT_QUIET_SECONDS", "MAX_DECODED_BYTES", "ExportOutcome", "ReceivedSpan",
    "decode_export", "encode_response", "flush_quiet_traces", "receive_spans",
]
