"""Server-Sent Events for a run's event stream.

Each loop reads a page of new events in its own short read transaction, sends them, and then
waits on the process's notifier without holding a connection. ``id:`` is the seq, so a client
that reconnects with ``Last-Event-ID`` continues exactly after the last event it saw.
"""

from __future__ import annotations

import json
import time

from flask import Response, request, stream_with_context

from agentledger.api.request_scope import owner_scope, run_not_found, state
from agentledger.api.requests import MAX_INT32
from agentledger.core.errors import InvalidRequest
from agentledger.web.metrics import STREAMS_OPEN
from queries.run_events import events_page_of, events_page_read

PAGE = 500
RETRY_MS = 2000


def wants_event_stream() -> bool:
    accept = request.headers.get("Accept", "")
    return "text/event-stream" in accept


def _start_after(default: int) -> int:
    header = request.headers.get("Last-Event-ID")
    if header is None or header.strip() == "":
        return default
    try:
        value = int(header.strip())
    except ValueError as exc:
        raise InvalidRequest("Last-Event-ID must be an event seq (an integer)") from exc
    if value < 0:
        raise InvalidRequest("Last-Event-ID must not be negative")
    if value > MAX_INT32:
        raise InvalidRequest(f"Last-Event-ID must be at most {MAX_INT32} (an event seq)")
    return value


def frame(event: dict) -> str:
    return f"id: {event['seq']}\nevent: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def _next_page(db, run_id: str, after_seq: int, scope: str | None):
    """The events after ``after_seq`` with the run's head (None: the caller may not see it)."""
    stmt, params = events_page_read(run_id, after_seq=after_seq, limit=PAGE, visible_to=scope)
    return events_page_of(db.read_rows(stmt, params, fresh=True), run_id, after_seq)


def _first_page(run_id: str, after_seq: int, scope: str | None):
    """The stream's first page, which also says whether the caller may see the run (None: not
    found). Like ``request_scope.read_one``, "not found" on a replica is asked of the primary."""
    db = state().db
    page = _next_page(db, run_id, after_seq, scope)
    if page is None and db.read_url is not None:
        stmt, params = events_page_read(run_id, after_seq=after_seq, limit=PAGE,
                                        visible_to=scope)
        with db.read(primary=True) as session:
            page = events_page_of(session.execute(stmt, params).all(), run_id, after_seq)
    return page


def event_stream_response(run_id: str, after_seq: int) -> Response:
    start = _start_after(after_seq)
    scope = owner_scope()
    app_state = state()
    keepalive = app_state.settings.sse_keepalive_seconds
    notifier = app_state.notifier
    key = run_id
    # Subscribed before the first read, so that an event committed after it wakes the stream;
    # the first page says whether the run exists and is visible (no separate head read). The
    # subscription ends when the response is closed, whether or not it was ever iterated.
    notifier.subscribe(key)
    streaming = False
    try:
        seen = notifier.generation(key)
        first = _first_page(run_id, start, scope)
        if first is None:
            raise run_not_found(run_id)
        if first.terminal and not first.events:
            return Response(status=204)

        def generate():
            last, page, waited = start, first, seen
            STREAMS_OPEN.inc()
            try:
                yield f"retry: {RETRY_MS}\n\n"
                last_write = time.monotonic()
                while True:
                    if page is None:
                        waited = notifier.generation(key)
                        page = _next_page(app_state.db, run_id, last, scope)
                        if page is None:
                            return
                    if page.events:
                        yield "".join(frame(e) for e in page.events)
                        last = page.next_after_seq
                        last_write = time.monotonic()
                    if page.terminal:
                        return
                    full = len(page.events) == PAGE
                    page = None
                    if full:
                        continue
                    remaining = keepalive - (time.monotonic() - last_write)
                    if remaining <= 0:
                        yield ": keep-alive\n\n"
                        last_write = time.monotonic()
                        remaining = keepalive
                    notifier.wait(key, waited, remaining)
            finally:
                STREAMS_OPEN.dec()

        # ``content_type``, not ``mimetype``: Flask would add "; charset=utf-8" to a text/*
        # mimetype, and the header is exactly "text/event-stream" (SSE is UTF-8 by definition).
        response = Response(stream_with_context(generate()), content_type="text/event-stream")
        response.call_on_close(lambda: notifier.unsubscribe(key))
        streaming = True
    finally:
        if not streaming:
            notifier.unsubscribe(key)
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    return response
