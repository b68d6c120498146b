"""One ``httpx.Client`` per API client, with the retry policy both clients share.

A request is retried only when repeating it cannot do anything twice:

- ``SAFE`` requests (reads, cancel, a message post carrying its ``Idempotency-Key``, a
  heartbeat) are retried after a connection error, a dropped or timed-out answer, any 5xx, and a
  429 (after its ``Retry-After``);
- ``UNSENT`` requests (creating a session, claiming, appending events, creating a child: none of
  them carries a key) are retried only when the request certainly never reached the server (the
  connection could not be opened) and after a 429, which the server answers before doing
  anything.

Waits grow exponentially (``backoff`` × 2ⁿ with jitter, at most ``max_backoff``); a
``Retry-After`` is honoured up to ``max_retry_after`` seconds. A request given a ``deadline``
(``time.monotonic()`` seconds) raises ``TimeoutError`` once it passes, whatever is left of the
retries.

Ids go into paths through ``segment``: one percent-encoded path segment each, so that no id can
name another route.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx

from agentledger import __version__
from agentledger.client.errors import ApiError, ConnectionFailed

# Connect fails fast; an answer may take a while under load (a read timeout counts as a dropped
# answer and is retried for SAFE requests).
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)

SAFE = "safe"
UNSENT = "unsent"

_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5  # tries in all, the first included
    backoff: float = 0.2
    max_backoff: float = 5.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * 2 ** attempt) * random.uniform(0.5, 1.0)


def segment(value: str, what: str) -> str:
    """``value`` (the id of a ``what``: "run", "session", …) as one path segment.

    Everything but letters, digits and ``-._~`` is percent-encoded (``?``, ``#``, ``%``, …), and
    a segment of only dots is spelled ``%2E`` so that URL normalisation does not take ``..`` for
    a step up the path. An empty id, or one with a ``/``, cannot name anything: the WSGI server
    percent-decodes the path before the routes see it, so even ``%2F`` would split the segment
    (``run_x%2Ftree`` is run_x's tree). Those get the server's answer for an unknown id, 404
    ``not_found``, without a request."""
    if not value or "/" in value:
        raise ApiError(404, "not_found", f"{what} {value!r} does not exist (an id is never "
                                         f"empty and never contains '/')")
    quoted = quote(value, safe="")
    if quoted.strip(".") == "":
        quoted = "%2E" * len(quoted)
    return quoted


def bounded(timeout: httpx.Timeout, left: float) -> httpx.Timeout:
    """``timeout`` with each of its parts at most ``left`` seconds."""
    def cap(value: float | None) -> float:
        return left if value is None else min(value, left)

    return httpx.Timeout(connect=cap(timeout.connect), read=cap(timeout.read),
                         write=cap(timeout.write), pool=cap(timeout.pool))


def seconds_left(deadline: float | None, what: str) -> float | None:
    """Seconds until ``deadline`` (None: no deadline); ``TimeoutError`` once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(what)
    return left


def sleep_until(seconds: float, deadline: float | None, what: str) -> None:
    """Sleep ``seconds``, or until ``deadline`` and then raise ``TimeoutError``."""
    left = seconds_left(deadline, what)
    time.sleep(seconds if left is None else min(seconds, left))
    seconds_left(deadline, what)


@contextmanager
def interrupted_at(response: httpx.Response, deadline: float | None) -> Iterator[None]:
    """Shut the socket of a streamed ``response`` down at ``deadline`` while inside the block,
    so that a read waiting on a silent connection returns then (as a ``TransportError``).

    httpx's read timeout applies to each read and starts again with every chunk that arrives,
    so a stream that receives a keep-alive now and then would otherwise outlive any deadline.
    Nothing happens after the block: the connection may be back in the pool by then."""
    network = response.extensions.get("network_stream")
    sock = network.get_extra_info("socket") if network is not None else None
    if deadline is None or not isinstance(sock, socket.socket):
        yield
        return
    lock = threading.Lock()
    inside = True

    def cut() -> None:
        with lock:
            if inside:
                try:
                    # The plain socket's shutdown, also under TLS: it wakes the reading thread
                    # without touching the TLS object that thread is using.
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), cut)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            inside = False
        timer.cancel()


def retry_after_seconds(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def json_of(response: httpx.Response) -> Any:
    """The JSON body of a successful answer, or ``ApiError`` (``unexpected_response``) when it
    is none: a proxy's or a captive portal's page can answer 200 too."""
    try:
        return response.json()
    except ValueError:
        text = response.text.strip()[:200] or response.reason_phrase
        raise ApiError(response.status_code, "unexpected_response",
                       f"the answer is not JSON: {text}", dict(response.headers)) from None


def error_from(response: httpx.Response) -> ApiError:
    """The ``ApiError`` of an error answer (its body read)."""
    try:
        body = response.json()
        error = body["error"]
        return ApiError(response.status_code, str(error["code"]), str(error["message"]),
                        dict(response.headers))
    except (ValueError, KeyError, TypeError):
        text = response.text.strip()[:200] or response.reason_phrase
        return ApiError(response.status_code, "unexpected_response", text, dict(response.headers))


class Transport:
    def __init__(self, base_url: str, token: str, *, timeout: float | httpx.Timeout | None = None,
                 retry: RetryPolicy | None = None, transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.timeout = DEFAULT_TIMEOUT if timeout is None else httpx.Timeout(timeout)
        self.client = httpx.Client(
            base_url=self.base_url, timeout=self.timeout, transport=transport,
            headers={"Authorization": f"Bearer {token}",
                     "User-Agent": f"agentledger-client/{__version__}"},
        )

    def close(self) -> None:
        self.client.close()

    def request(self, method: str, path: str, *, json: Any = None,
                params: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                retry: str = SAFE, deadline: float | None = None,
                unsent_seconds: float = 0.0) -> httpx.Response:
        """The successful answer; raises ``ApiError`` / ``ConnectionFailed`` otherwise, and
        ``TimeoutError`` once ``deadline`` (``time.monotonic()`` seconds) has passed.

        ``unsent_seconds``: a request that certainly never reached the server (no connection
        could be made) is tried again after the policy's attempts run out, until this long
        after the first try: a server restarting for a few seconds is waited for."""
        policy = self.retry
        late = f"{method} {self.base_url}{path}: no answer in time"
        patient_until = time.monotonic() + unsent_seconds
        attempt = 0
        while True:
            last = attempt + 1 >= policy.attempts
            left = seconds_left(deadline, late)
            timeout = httpx.USE_CLIENT_DEFAULT if left is None else bounded(self.timeout, left)
            try:
                response = self.client.request(method, path, json=json, params=params,
                                               headers=headers, timeout=timeout)
            except httpx.TransportError as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(late) from exc
                unsent = isinstance(exc, _NOT_SENT)
                again = not last or (unsent and time.monotonic() < patient_until)
                if again and (retry == SAFE or unsent):
                    sleep_until(policy.delay(attempt), deadline, late)
                    attempt += 1
                    continue
                raise ConnectionFailed(f"{method} {self.base_url}{path}: "
                                       f"{type(exc).__name__}: {exc}") from exc
            if response.status_code < 400:
                return response
            wait = self.wait_before_retry(response, attempt, retry)
            if last or wait is None:
                raise error_from(response)
            sleep_until(wait, deadline, late)
            attempt += 1

    def wait_before_retry(self, response: httpx.Response, attempt: int, retry: str) -> float | None:
        """Seconds to wait before repeating a request that got this answer, or None."""
        status = response.status_code
        if status == 429:
            after = retry_after_seconds(response)
            if after is None or after > self.retry.max_retry_after:
                return None
            return after
        if status >= 500 and retry == SAFE:
            # A 503 may say when to come back (``database_unavailable``: Retry-After 1).
            after = retry_after_seconds(response)
            backoff = self.retry.delay(attempt)
            if after is None:
                return backoff
            return max(backoff, min(after, self.retry.max_retry_after))
        return None
