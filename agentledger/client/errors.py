"""The one exception the clients raise for an error answer, and its transport-failure cousin."""

from __future__ import annotations


class ApiError(Exception):
    """The server answered with an error: ``status`` (HTTP), ``code`` and ``message`` from the
    contract's envelope ``{"error": {"code", "message"}}``. An answer that is not that envelope
    (an HTML page from a proxy, say) gets the code ``unexpected_response``.

    ``idempotency_key``: set when ``LedgerClient.send_message`` raises, to the key it sent;
    repeating the call with ``idempotency_key=exc.idempotency_key`` can never create a second
    run, whatever became of the first attempt."""

    idempotency_key: str | None = None

    def __init__(self, status: int | None, code: str, message: str,
                 headers: dict[str, str] | None = None):
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


class ConnectionFailed(ApiError):
    """No answer at all (connection refused, dropped or timed out) after every retry;
    ``status`` is None and ``code`` is ``connection_failed``."""

    def __init__(self, message: str):
        super().__init__(None, "connection_failed", message)
