"""``LedgerClient``: what an application needs to talk to agents through a ledger server."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx

from agentledger.client.errors import ConnectionFailed
from agentledger.client.sse import frames
from agentledger.client.transport import SAFE, UNSENT, RetryPolicy, Transport, error_from

TERMINAL_EVENTS = frozenset({"run.completed", "run.failed", "run.cancelled", "run.interrupted"})
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "interrupted"})
# An idle stream gets a keep-alive comment at least every 15 s; a read that waits longer than
# this means the connection is gone, and the stream reconnects.
STREAM_READ_TIMEOUT = 45.0


def new_idempotency_key() -> str:
    return f"alc-{uuid.uuid4().hex}"


class LedgerClient:
    """``LedgerClient("http://127.0.0.1:8050", token)``; use as a context manager or ``close()``.

    ``timeout``: seconds (or an ``httpx.Timeout``) for each request, default 30 s (connect 5 s);
    ``stream_read_timeout``: the longest silence an event stream tolerates before it reconnects;
    ``retry``: a ``RetryPolicy`` (attempts, backoff).
    """

    def __init__(self, base_url: str, token: str, *, timeout: float | httpx.Timeout | None = None,
                 stream_read_timeout: float = STREAM_READ_TIMEOUT,
                 retry: RetryPolicy | None = None, transport: httpx.BaseTransport | None = None):
        self._http = Transport(base_url, token, timeout=timeout, retry=retry, transport=transport)
        self.base_url = self._http.base_url
        self.stream_read_timeout = stream_read_timeout

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _json(self, method: str, path: str, **kwargs) -> Any:
        return self._http.request(method, path, **kwargs).json()

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
        here when none is given), so however often it is repeated the server creates one run."""
        body: dict[str, Any] = {"content": content}
        if agent_id is not None:
            body["agent_id"] = agent_id
        if context is not None:
            body["context"] = context
        key = idempotency_key or new_idempotency_key()
        return self._json("POST", f"/api/sessions/{session_id}/messages", json=body,
                          headers={"Idempotency-Key": key}, retry=SAFE)

    # ---- runs ----------------------------------------------------------------------------

    def get_run(self, run_id: str) -> dict:
        return self._json("GET", f"/api/agent-runs/{run_id}")

    def cancel(self, run_id: str) -> dict:
        """``{"run_id", "status"}``; repeating a cancel is harmless, so it is retried."""
        return self._json("POST", f"/api/agent-runs/{run_id}/cancel", retry=SAFE)

    def tree(self, run_id: str) -> dict:
        return self._json("GET", f"/api/agent-runs/{run_id}/tree")

    def provenance(self, message_id: str) -> dict:
        return self._json("GET", f"/api/messages/{message_id}/provenance")

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> dict:
        """One JSON page of the run's events."""
        params: dict[str, Any] = {"after_seq": after_seq}
        if limit is not None:
            params["limit"] = limit
        return self._json("GET", f"/api/agent-runs/{run_id}/events", params=params)

    def stream_events(self, run_id: str, after_seq: int = 0) -> Iterator[dict]:
        """The run's events after ``after_seq`` as they happen, each once and in order, ending
        after the terminal event. A dropped connection is resumed with ``Last-Event-ID``."""
        return self._stream(run_id, after_seq, deadline=None)

    def wait(self, run_id: str, timeout: float | None = None) -> dict:
        """Follow the run until it is terminal and return it (``get_run``); ``TimeoutError``
        when ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        run = self.get_run(run_id)
        if run["status"] in TERMINAL_STATUSES:
            return run
        for _event in self._stream(run_id, run["last_event_seq"], deadline=deadline):
            pass
        return self.get_run(run_id)

    def _stream(self, run_id: str, after_seq: int, *, deadline: float | None) -> Iterator[dict]:
        last = after_seq
        failures = 0
        policy = self._http.retry
        path = f"/api/agent-runs/{run_id}/events"
        while True:
            read = self.stream_read_timeout
            if deadline is not None:
                read = min(read, deadline - time.monotonic())
                if read <= 0:
                    raise TimeoutError(f"run {run_id} did not finish in time")
            headers = {"Accept": "text/event-stream"}
            if last:
                headers["Last-Event-ID"] = str(last)
            timeout = httpx.Timeout(self._http.timeout.connect or 5.0, read=read)
            progressed = False
            try:
                with self._http.client.stream("GET", path, headers=headers, timeout=timeout,
                                              params={"after_seq": after_seq}) as response:
                    if response.status_code == 204:
                        return  # the run had already ended at or before ``last``
                    if response.status_code >= 400:
                        response.read()
                        wait = self._http.wait_before_retry(response, failures, SAFE)
                        if wait is None or failures + 1 >= policy.attempts:
                            raise error_from(response)
                        failures += 1
                        time.sleep(wait)
                        continue
                    for frame in frames(response.iter_lines()):
                        event = json.loads("\n".join(frame.data))
                        if event["seq"] <= last:
                            continue  # never repeat an event, whatever the server sends
                        last = event["seq"]
                        progressed = True
                        yield event
                        if event["type"] in TERMINAL_EVENTS:
                            return
            except httpx.TransportError as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"run {run_id} did not finish in time") from exc
                if progressed:
                    failures = 0
                failures += 1
                if failures >= policy.attempts:
                    raise ConnectionFailed(f"event stream of run {run_id}: "
                                           f"{type(exc).__name__}: {exc}") from exc
                time.sleep(policy.delay(failures - 1))
                continue
            # The server closed the stream without a terminal event (a restart, a proxy):
            # reconnect after the last event seen.
            failures = 0 if progressed else failures + 1
            if failures >= policy.attempts:
                raise ConnectionFailed(f"event stream of run {run_id} keeps closing early")
            if not progressed:
                time.sleep(policy.delay(failures - 1))
