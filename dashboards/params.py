"""Filters in the URL: parsing query-string values and writing them back (shareable links).

Pure functions: strings in, plain values out. A page's ``layout(**kwargs)`` receives the query
string as keyword arguments; its callbacks write the canonical query string back with
``query_string``.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import urlencode

from queries.common import WINDOW_SPANS, TimeWindow

_LABELS = {"1h": "Last hour", "6h": "Last 6 hours", "24h": "Last 24 hours", "7d": "Last 7 days",
           "14d": "Last 14 days", "30d": "Last 30 days", "90d": "Last 90 days", "all": "All time"}
# The presets are the read side's (the JSON twins accept the same keys), plus custom dates.
WINDOW_CHOICES: dict[str, tuple[str, timedelta | None]] = {
    **{key: (_LABELS[key], span) for key, span in WINDOW_SPANS.items()},
    "custom": ("Custom dates…", None),
}
DEFAULT_WINDOW = "7d"

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")


def text(value: object, *, max_length: int = 200) -> str | None:
    """A trimmed string, or None when empty."""
    if value is None:
        return None
    found = str(value).strip()[:max_length]
    return found or None


def identifier(value: object) -> str | None:
    """An id-like value (run, session, agent, owner, executor ids), else None."""
    found = text(value)
    return found if found and _ID.match(found) else None


def integer(value: object, default: int | None, *, low: int, high: int) -> int | None:
    try:
        number = int(str(value))
    except (TypeError, ValueError):
        return default
    return max(low, min(high, number))


def choice(value: object, allowed, default: str | None = None) -> str | None:
    return value if isinstance(value, str) and value in allowed else default


def _day(value: object) -> date | None:
    try:
        return date.fromisoformat(str(value)[:10]) if value else None
    except ValueError:
        return None


def window_key(value: object, default: str = DEFAULT_WINDOW) -> str:
    return choice(value, WINDOW_CHOICES, default) or default


def resolve_window(
    key: str, since: object = None, until: object = None, *, now: datetime | None = None
) -> TimeWindow:
    """A preset relative to now, or ``custom`` whole UTC days from ``since`` to ``until``."""
    now = now or datetime.now(UTC)
    if key == "custom":
        start, end = _day(since), _day(until)
        return TimeWindow(
            datetime.combine(start, time(), UTC) if start else None,
            datetime.combine(end + timedelta(days=1), time(), UTC) if end else None,
        )
    span = WINDOW_CHOICES.get(key, WINDOW_CHOICES[DEFAULT_WINDOW])[1]
    return TimeWindow(now - span, None) if span is not None else TimeWindow()


def describe_window(key: str, since: object = None, until: object = None) -> str:
    if key == "custom":
        start, end = _day(since), _day(until)
        return f"{start or 'the beginning'} to {end or 'now'} (UTC days)"
    return WINDOW_CHOICES.get(key, WINDOW_CHOICES[DEFAULT_WINDOW])[0].lower()


def query_string(params: dict[str, object], defaults: dict[str, object] | None = None) -> str:
    """``?a=1&b=x`` of the non-empty params that differ from their defaults ('' if none)."""
    defaults = defaults or {}
    kept = {
        k: v for k, v in params.items()
        if v not in (None, "") and str(v) != str(defaults.get(k, ""))
    }
    return "?" + urlencode(kept) if kept else ""
