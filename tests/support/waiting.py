"""The one wait of the tests: poll a condition until it holds or a generous deadline passes.

Waits assert behaviour, never speed: a deadline only stops a test that would otherwise hang, so
it is long (a loaded CI machine is slow), and a wait that succeeds returns at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, *,
               message: str | Callable[[], str] = "condition") -> Any:
    """Poll ``condition`` every ``interval`` seconds until it returns something truthy and
    return that value; after ``timeout`` seconds raise ``AssertionError`` naming ``message``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:g}s waiting for {text}")
        time.sleep(interval)
