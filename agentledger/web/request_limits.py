"""Over-long request lines and headers get the JSON error envelope, never an HTML page.

Two layers refuse them. The app (a ``before_request`` hook, for every path) answers
``414 invalid_request`` for a request target over ``MAX_URL_BYTES`` and ``431 invalid_request``
for more than ``MAX_HEADER_FIELDS`` header fields or one over ``MAX_HEADER_FIELD_BYTES``.
gunicorn's own limits (agentledger.server) sit above these, so the app sees and answers such
requests itself; what is larger still, gunicorn refuses before any app runs, and
``agentledger.server.ServeWorker`` writes that refusal in the same envelope.
"""

from __future__ import annotations

import json
import logging

from flask import Response, request

from agentledger.web.error_envelope import error_response

log = logging.getLogger("agentledger.web.request_limits")

MAX_URL_BYTES = 8_000
MAX_HEADER_FIELDS = 100
MAX_HEADER_FIELD_BYTES = 8_190


def _request_target() -> str:
    environ = request.environ
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return raw
    query = environ.get("QUERY_STRING", "")
    return environ.get("PATH_INFO", "") + ("?" + query if query else "")


def refuse_oversized() -> Response | None:
    """``before_request``: the JSON refusal of a too-long URL or too-large headers, else None."""
    target = _request_target()
    if len(target.encode("latin-1", "replace")) > MAX_URL_BYTES:
        return error_response(414, "invalid_request",
                              f"the request URL is longer than {MAX_URL_BYTES} bytes")
    fields = [(k, v) for k, v in request.environ.items()
              if k.startswith("HTTP_") or k in ("CONTENT_TYPE", "CONTENT_LENGTH")]
    if len(fields) > MAX_HEADER_FIELDS:
        return error_response(431, "invalid_request",
                              f"the request has more than {MAX_HEADER_FIELDS} header fields")
    for key, value in fields:
        if len(key) + len(str(value)) > MAX_HEADER_FIELD_BYTES:
            return error_response(431, "invalid_request",
                                  f"a request header is longer than {MAX_HEADER_FIELD_BYTES} bytes")
    return None


def json_error_bytes(status: int, reason: str, code: str, message: str) -> bytes:
    """A complete HTTP/1.1 error response with the JSON envelope (for the server layer)."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body
