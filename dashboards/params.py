"""Filters in the URL: parsing query-string values and writing them back (shareable links).

Pure functions: strings in, plain values out. A page's ``layout(**kwargs)`` receives the query
string as keyword arguments; its callbacks write the canonical query string back with
``query_string``, and the link to the page's JSON twin with ``twin_href``.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import urlencode

from queries.common import MAX_LIMIT, WINDOW_SPANS, TimeWindow

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


# --- the JSON twin of a page (CONTRACT §9) ------------------------------------------------------

# A page's URL names a filter for people; its JSON twin by the API's name for the same filter.
# Every page's "JSON" link translates through this one table.
TWIN_NAMES = {"q": "q", "agent": "agent_id", "owner": "owner_id", "session": "session_id",
              "root": "root_run_id", "status": "status", "reason": "reason",
              "executor": "executor_instance_id", "seen": "seen_minutes",
              "risk": "at_risk_seconds", "action": "action", "actor": "actor"}
# The most rows one twin page holds (its ``limit``); the twin's next_cursor goes on from there.
TWIN_MAX_LIMIT = MAX_LIMIT


def _twin_value(value: object) -> object:
    if value is True:
        return "true"
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return value


def twin_window(key: str, since: object = None, until: object = None, *,
                bounds: str = "created") -> dict[str, object]:
    """A page's time window as its twin's parameters: a preset as itself (``window=7d``, which
    the twin resolves against its own clock, as the page did against its own), custom dates as
    the very bounds the page reads: ``<bounds>_after`` at the first day's start and
    ``<bounds>_before`` at the end of the last day (UTC)."""
    if key != "custom":
        return {"window": key}
    window = resolve_window(key, since, until)
    if window.start is None and window.end is None:
        return {"window": "all"}  # custom dates with neither day picked: all time, as on the page
    return {f"{bounds}_after": window.start, f"{bounds}_before": window.end}


def twin_href(path: str, filters: dict[str, object] | None = None, *,
              window: tuple[str, object, object] | None = None, bounds: str = "created",
              **twin_params: object) -> str:
    """The link to a page's JSON twin that returns what the page shows: ``path`` with the page's
    ``filters`` (its URL names, renamed by ``TWIN_NAMES``), its ``window`` (``(key, since,
    until)``, see ``twin_window``) and ``twin_params`` already named as the twin names them.
    Empty values (None, '', False) are left out; True is ``true``, a datetime ISO 8601 in UTC."""
    query: dict[str, object] = {TWIN_NAMES[name]: value for name, value in (filters or {}).items()}
    if window is not None:
        query.update(twin_window(*window, bounds=bounds))
    query.update(twin_params)
    kept = {name: _twin_value(value) for name, value in query.items()
            if value is not None and value is not False and value != ""}
    return f"{path}?{urlencode(kept, safe=':')}" if kept else path
