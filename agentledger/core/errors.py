"""Every error a client can see, each with its HTTP status and contract error code.

``ingest`` raises these (translating database errors with ``raise … from exc``); the API maps
them to ``{"error": {"code", "message"}}`` in one place (``agentledger.web.error_envelope``).
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base class: ``status`` and ``code`` are what the client receives."""

    status = 500
    code = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class InvalidRequest(LedgerError):
    """The request cannot be read at all: malformed JSON, a body that is not an object, bad query."""

    status, code = 400, "invalid_request"


class IdempotencyKeyRequired(LedgerError):
    """A run-creating POST came without a usable ``Idempotency-Key`` header."""

    status, code = 400, "idempotency_key_required"


class Unauthenticated(LedgerError):
    """No token, an unknown token or a revoked one."""

    status, code = 401, "unauthenticated"


class Forbidden(LedgerError):
    """The caller's role may not use this route at all (never used to hide another owner's rows)."""

    status, code = 403, "forbidden"


class NotFound(LedgerError):
    """No such object, or one the caller may not see (another owner's look exactly the same)."""

    status, code = 404, "not_found"


class Conflict(LedgerError):
    """The object already exists (e.g. an agent id)."""

    status, code = 409, "conflict"


class IdempotencyConflict(LedgerError):
    """The idempotency key was already used by this owner for a different request."""

    status, code = 409, "idempotency_conflict"


class RunTerminal(LedgerError):
    """The run has ended; it never changes again."""

    status, code = 409, "run_terminal"


class CancelRequested(LedgerError):
    """The run is being cancelled: only ``run.cancelled`` or ``run.interrupted`` may end it."""

    status, code = 409, "cancel_requested"


class IllegalTransition(LedgerError):
    """The state machine does not allow this event in the run's current state."""

    status, code = 409, "illegal_transition"


class LeaseLost(LedgerError):
    """The caller no longer holds the run's lease (expired, another instance, or run ended)."""

    status, code = 409, "lease_lost"


class PayloadTooLarge(LedgerError):
    """The request body is larger than the configured limit."""

    status, code = 413, "payload_too_large"


class UnsupportedMediaType(LedgerError):
    """The body's Content-Type (or Content-Encoding) is not one the route reads."""

    status, code = 415, "unsupported_media_type"


class ValidationFailed(LedgerError):
    """The body parsed but a field is missing, of the wrong type or out of range."""

    status, code = 422, "validation_error"


class FrameworkUnavailable(LedgerError):
    """A memory route of an agent framework (LangGraph checkpoints, Agents SDK sessions) was
    called on a server that does not have that framework installed."""

    status, code = 422, "framework_unavailable"


class UnknownAgent(LedgerError):
    """The named agent is not registered."""

    status, code = 422, "unknown_agent"


class NotAnAssistantMessage(LedgerError):
    """Provenance was asked of a user message; only answers have a producing run."""

    status, code = 422, "not_an_assistant_message"


class RateLimited(LedgerError):
    """Too many requests; the response carries ``Retry-After``."""

    status, code = 429, "rate_limited"


class ReplicaUnavailable(LedgerError):
    """A read on the read replica failed part-way (the replica went away, or cancelled the query
    in a conflict with its recovery); the next attempt is served by the primary or the replica
    again. Reads that start while the replica is unreachable go to the primary instead."""

    status, code = 503, "replica_unavailable"

    def __init__(self, message: str):
        super().__init__(message, headers={"Retry-After": "1"})


class DatabaseUnavailable(LedgerError):
    """The database could not serve the request: it closed the connection, cannot be reached,
    refuses connections, or (SQLite) stayed locked past the busy timeout
    (``core.database.connection_failed``; ``web.error_envelope`` answers it). A write that
    failed this way may have committed: only a request that is safe to repeat (a read, a
    cancel, a message post with its ``Idempotency-Key``) should be sent again as it is."""

    status, code = 503, "database_unavailable"

    def __init__(self, message: str = "the database is unavailable; retry shortly"):
        super().__init__(message, headers={"Retry-After": "1"})
