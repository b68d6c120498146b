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
``Retry-After`` is honoured up to ``max_retry_after`` seconds.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

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
                retry: str = SAFE) -> httpx.Response:
        """The successful answer; raises ``ApiError`` / ``ConnectionFailed`` otherwise."""
        policy = self.retry
        for attempt in range(policy.attempts):
            last = attempt + 1 >= policy.attempts
            try:
                response = self.client.request(method, path, json=json, params=params,
                                               headers=headers)
            except httpx.TransportError as exc:
                if not last and (retry == SAFE or isinstance(exc, _NOT_SENT)):
                    time.sleep(policy.delay(attempt))
                    continue
                raise ConnectionFailed(f"{method} {self.base_url}{path}: "
                                       f"{type(exc).__name__}: {exc}") from exc
            if response.status_code < 400:
                return response
            wait = self.wait_before_retry(response, attempt, retry)
            if last or wait is None:
                raise error_from(response)
            time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def wait_before_retry(self, response: httpx.Response, attempt: int, retry: str) -> float | None:
        """Seconds to wait before repeating a request that got this answer, or None."""
        status = response.status_code
        if status == 429:
            after = retry_after_seconds(response)
            if after is None or after > self.retry.max_retry_after:
                return None
            return after
        if status >= 500 and retry == SAFE:
            return self.retry.delay(attempt)
        return None
