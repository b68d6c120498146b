"""One mapping from exceptions to the JSON error envelope; no stack trace ever leaves."""

from __future__ import annotations

import logging

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from agentledger.core.database import connection_failed
from agentledger.core.errors import DatabaseUnavailable, LedgerError

log = logging.getLogger("agentledger.api")

HTTP_CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "invalid_request",
    429: "rate_limited",
}


def error_response(status: int, code: str, message: str, headers: dict | None = None):
    response = jsonify({"error": {"code": code, "message": message}})
    response.status_code = status
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def _is_api() -> bool:
    return request.path.startswith("/api/") or request.path == "/api"


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(LedgerError)
    def _ledger_error(exc: LedgerError):
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        # Pages keep the framework's HTML for what a browser meets (404 of a page); a method a
        # path does not take (POST /metrics) or a body too large is a program's mistake.
        if not _is_api() and exc.code not in (405, 413):
            return exc
        status = exc.code or 500
        messages = {
            404: f"no route {request.path}",
            405: f"{request.method} is not allowed on {request.path}",
            413: "the request body is larger than allowed",
        }
        headers = {}
        if status == 405 and getattr(exc, "valid_methods", None):
            headers["Allow"] = ", ".join(exc.valid_methods)
        return error_response(
            status, HTTP_CODES.get(status, "invalid_request"),
            messages.get(status, exc.description or "request refused"), headers,
        )

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        if connection_failed(exc):
            # An outage, not a bug: one line each, and the client is told to come back.
            log.warning("database unavailable on %s %s: %s", request.method, request.path,
                        _summary(exc))
            return _ledger_error(DatabaseUnavailable())
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal_error", "the server failed; the error was logged")


def _summary(exc: BaseException) -> str:
    """The driver's error type and the first line of its message: a wrapped statement error's
    text goes on with the SQL and its parameters, which stay out of the log."""
    cause = getattr(exc, "orig", None) or exc
    kind = type(cause)
    lines = str(cause).strip().splitlines()
    return f"{kind.__module__}.{kind.__qualname__}: {lines[0] if lines else '(no message)'}"
