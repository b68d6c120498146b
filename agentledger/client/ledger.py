"""``LedgerClient``: what an application needs to talk to agents through a ledger server."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx

from agentledger.client.errors import ApiError, ConnectionFailed
from agentledger.client.sse import EventStreamParser
from agentledger.client.transport import (
    SAFE,
    UNSENT,
    RetryPolicy,
    Transport,
    bounded,
    error_from,
    interrupted_at,
    json_of,
    seconds_left,
    segment,
    sleep_until,
)

TERMINAL_EVENTS = frozenset({"run.completed", "run.failed", "run.cancelled", "run.interrupted"})
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "interrupted"})
# An idle stream gets a keep-alive comment at least every 15 s; a read that waits longer than
# this means the connection is gone, and the stream reconnects.
STREAM_READ_TIMEOUT = 45.0
# How long a stream keeps reconnecting without getting a working connection back: longer than a
# server takes to restart.
STREAM_RECONNECT_SECONDS = 60.0
IDEMPOTENCY_KEY_LENGTH = 255


def new_idempotency_key() -> str:
    return f"alc-{uuid.uuid4().hex}"


def checked_idempotency_key(key: str) -> str:
    """``key`` if the server accepts it as an ``Idempotency-Key``: 1-255 printable characters
    (space included; sent as UTF-8), and no space at either end, which HTTP would not carry."""
    if not (0 < len(key) <= IDEMPOTENCY_KEY_LENGTH and key.isprintable()
            and key.strip(" ") == key):
        raise ValueError(f"idempotency_key must be 1-{IDEMPOTENCY_KEY_LENGTH} printable "
                         f"characters, without a space at either end; got {key!r:.80}")
    return key


def _event_of(data: list[str], response: httpx.Response) -> dict:
    """One event stream frame's event, or ``ApiError`` (``unexpected_response``) for a frame
    that holds none (what sits between the client and the ledger may rewrite a stream)."""
    text = "\n".join(data)
    try:
        event = json.loads(text)
        if isinstance(event, dict) and isinstance(event["seq"], int) and event["type"]:
            return event
    except (ValueError, KeyError, TypeError):
        pass
    raise ApiError(response.status_code, "unexpected_response",
                   f"an event stream frame holds no event: {text[:200]}", dict(response.headers))


class LedgerClient:
    """``LedgerClient("http://127.0.0.1:8050", token)``; use as a context manager or ``close()``.

    ``timeout``: seconds (or an ``httpx.Timeout``) for each request, default 30 s (connect 5 s);
    ``stream_read_timeout``: the longest silence an event stream tolerates before it reconnects;
    ``stream_reconnect_seconds``: how long an event stream keeps reconnecting while the server
    cannot be reached (a restart), default 60 s, before it raises ``ConnectionFailed``;
    ``retry``: a ``RetryPolicy`` (attempts, backoff).
    """

    def __init__(self, base_url: str, token: str, *, timeout: float | httpx.Timeout | None = None,
                 stream_read_timeout: float = STREAM_READ_TIMEOUT,
                 stream_reconnect_seconds: float = STREAM_RECONNECT_SECONDS,
                 retry: RetryPolicy | None = None, transport: httpx.BaseTransport | None = None):
        self._http = Transport(base_url, token, timeout=timeout, retry=retry, transport=transport)
        self.base_url = self._http.base_url
        self.stream_read_timeout = stream_read_timeout
        self.stream_reconnect_seconds = stream_reconnect_seconds

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _json(self, method: str, path: str, **kwargs) -> Any:
        return json_of(self._http.request(method, path, **kwargs))

    # ---- sessions and messages -----------------------------------------------------------

    def create_session(self, agent_id: str, title: str | None = None) -> dict:
        body: dict[str, Any] = {"agent_id": agent_id}
        if title is not None:
            body["title"] = title
        return self._json("POST", "/api/sessions", json=body, retry=UNSENT)

    def send_message(self, session_id: str, content: str, *, agent_id: str | None = None,
                     context: list[dict] | None = None,
                     idempotency_key: str | None = None) -> dict:
        """Post a user message; returns ``{"message_id", "run_id", "events_url", "agent_id",
        "agent_name"}``. Every retry of this call sends the same ``Idempotency-Key`` (generated
        here when none is given), so however often it is repeated the server creates one run.

        ``idempotency_key``: 1-255 printable characters (``ValueError`` otherwise). When
        the call raises ``ApiError`` (``ConnectionFailed`` included: the message may or may not
        have been recorded), the key it sent is ``exc.idempotency_key``; to try again without
        risking a second run, call again with ``idempotency_key=exc.idempotency_key``."""
        body: dict[str, Any] = {"content": content}
        if agent_id is not None:
            body["agent_id"] = agent_id
        if context is not None:
            body["context"] = context
        key = (new_idempotency_key() if idempotency_key is None
               else checked_idempotency_key(idempotency_key))
        try:
            return self._json("POST", f"/api/sessions/{segment(session_id, 'session')}/messages",
                              json=body, headers={"Idempotency-Key": key.encode()},
                              retry=SAFE)
        except ApiError as exc:
            exc.idempotency_key = key
            raise

    # ---- runs ----------------------------------------------------------------------------

    def get_run(self, run_id: str) -> dict:
        return self._json("GET", f"/api/agent-runs/{segment(run_id, 'run')}")

    def cancel(self, run_id: str) -> dict:
        """``{"run_id", "status"}``; repeating a cancel is harmless, so it is retried."""
        return self._json("POST", f"/api/agent-runs/{segment(run_id, 'run')}/cancel", retry=SAFE)

    def tree(self, run_id: str) -> dict:
        return self._json("GET", f"/api/agent-runs/{segment(run_id, 'run')}/tree")

    def provenance(self, message_id: str) -> dict:
        return self._json("GET", f"/api/messages/{segment(message_id, 'message')}/provenance")

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> dict:
        """One JSON page of the run's events."""
        params: dict[str, Any] = {"after_seq": after_seq}
        if limit is not None:
            params["limit"] = limit
        return self._json("GET", f"/api/agent-runs/{segment(run_id, 'run')}/events",
                          params=params)

    def stream_events(self, run_id: str, after_seq: int = 0) -> Iterator[dict]:
        """The run's events after ``after_seq`` as they happen, each once and in order, ending
        after the terminal event. A dropped connection is resumed with ``Last-Event-ID``; while
        the server cannot be reached (a restart) the stream keeps trying, pausing as its
        ``retry:`` hint asks and longer after each failure, for ``stream_reconnect_seconds``,
        then raises ``ConnectionFailed``."""
        return self._stream(run_id, after_seq, deadline=None)

    def wait(self, run_id: str, timeout: float | None = None) -> dict:
        """Follow the run until it is terminal and return it (``get_run``); ``TimeoutError``
        when ``timeout`` seconds pass first, however the server behaves meanwhile (silent,
        keep-alives only, restarting)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            run = self._json("GET", f"/api/agent-runs/{segment(run_id, 'run')}",
                             deadline=deadline)
        except ConnectionFailed:
            # Unreachable (a restart, say): the stream keeps trying for longer, from the start.
            after_seq = 0
        else:
            if run["status"] in TERMINAL_STATUSES:
                return run
            after_seq = run["last_event_seq"]
        for _event in self._stream(run_id, after_seq, deadline=deadline):
            pass
        return self.get_run(run_id)

    def _stream(self, run_id: str, after_seq: int, *, deadline: float | None) -> Iterator[dict]:
        path = f"/api/agent-runs/{segment(run_id, 'run')}/events"
        late = f"run {run_id} did not finish in time"
        policy = self._http.retry
        budget = self.stream_reconnect_seconds
        last = after_seq
        retry_hint = 0.0  # the server's ``retry:``, in seconds
        failures = 0  # connections in a row that brought nothing
        outage_since: float | None = None  # when the stream last lost a working connection
        while True:
            left = seconds_left(deadline, late)
            headers = {"Accept": "text/event-stream"}
            if last:
                headers["Last-Event-ID"] = str(last)
            timeout = httpx.Timeout(self._http.timeout.connect or 5.0,
                                    read=self.stream_read_timeout)
            if left is not None:
                timeout = bounded(timeout, left)
            started = time.monotonic()
            alive = False  # this connection brought a new event or a keep-alive
            pause: float | None = None  # a pause the server asked for (Retry-After)
            problem: ApiError
            try:
                with self._http.client.stream("GET", path, headers=headers, timeout=timeout,
                                              params={"after_seq": after_seq}) as response:
                    if response.status_code == 204:
                        return  # the run had already ended at or before ``last``
                    if response.status_code >= 400:
                        response.read()
                        problem = error_from(response)
                        wait = self._http.wait_before_retry(response, failures, SAFE)
                        if wait is None:
                            raise problem
                        if response.status_code == 429:
                            pause = wait
                    else:
                        parser = EventStreamParser()
                        with interrupted_at(response, deadline):
                            for line in response.iter_lines():
                                frame = parser.feed(line)
                                if parser.retry_ms is not None:
                                    retry_hint = parser.retry_ms / 1000
                                alive = alive or parser.comments > 0
                                if frame is not None:
                                    event = _event_of(frame.data, response)
                                    if event["seq"] > last:  # never repeat an event
                                        last = event["seq"]
                                        alive = True
                                        yield event
                                        if event["type"] in TERMINAL_EVENTS:
                                            return
                                # after every line, not only when the stream reconnects: a
                                # stream of keep-alives would otherwise outlive the deadline
                                seconds_left(deadline, late)
                        # The server closed the stream without a terminal event (a restart,
                        # a proxy): reconnect after the last event seen.
                        problem = ConnectionFailed(f"event stream of run {run_id}: closed "
                                                   f"before the run's end")
            except httpx.TransportError as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(late) from exc
                problem = ConnectionFailed(f"event stream of run {run_id}: "
                                           f"{type(exc).__name__}: {exc}")
                problem.__cause__ = exc
            now = time.monotonic()
            if alive:
                # The connection worked until now: reconnect at once, and the time without one
                # counts from here.
                failures, outage_since = 0, now
                continue
            failures += 1
            outage_since = started if outage_since is None else outage_since
            remaining = outage_since + budget - now
            if remaining <= 0:
                if isinstance(problem, ConnectionFailed):
                    raise ConnectionFailed(f"{problem.message} (no working connection for "
                                           f"{budget:g} s)") from problem.__cause__
                raise problem
            if pause is None:
                pause = max(retry_hint, policy.delay(failures - 1))
            sleep_until(min(pause, remaining), deadline, late)
