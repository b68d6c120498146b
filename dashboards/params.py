"""Filters in the URL: parsing query-string values and writing them back (shareable links).

Pure functions: strings in, plain values out. A page's ``layout(**kwargs)`` receives the query
string as keyword arguments; its callbacks write the canonical query string back with
``query_string``, and the link to the page's JSON twin with ``twin_href``.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import urlencode

from agentledger.core.hashing import is_storable_text
from queries.common import MAX_LIMIT, WINDOW_SPANS, TimeWindow

_LABELS = {"1h": "Last hour", "6h": "Last 6 hours", "24h": "Last 24 hours", "7d": "Last 7 days",
           "14d": "Last 14 days", "30d": "Last 30 days", "90d": "Last 90 days", "all": "All time"}
# The presets are the read side's (the JSON twins accept the same keys), plus custom dates.
WINDOW_CHOICES: dict[str, tuple[str, timedelta | None]] = {
    **{key: (_LABELS[key], span) for key, span in WINDOW_SPANS.items()},
    "custom": ("Custom dates…", None),
}
DEFAULT_WINDOW = "7d"

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")
# The longest free-text filter: an owner, an executor instance id, an actor (and the search).
TEXT_LENGTH = 200
# The longest agent id (``AGENT_ID_PATTERN`` of the API: its twins take no longer one).
AGENT_ID_LENGTH = 63
# The longest session or run id a twin takes as a filter (``session_id``, ``root_run_id``).
RUN_ID_LENGTH = 40
# A twin takes window bounds in the years 1900 to 9000 (agentledger.api.requests): custom days
# are read within them, so that a page and its JSON link read the same window.
_FIRST_BOUND = datetime(1900, 1, 1, tzinfo=UTC)
_LAST_BOUND = datetime(9000, 12, 31, tzinfo=UTC)
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def text(value: object, *, max_length: int = TEXT_LENGTH) -> str | None:
    """Free text someone typed (words to search for, an owner, an executor, an actor): the
    string trimmed and cut to ``max_length`` characters, or None when it is empty, not a string,
    or not storable (NUL or lone surrogates, which no stored value holds and the databases
    refuse as a parameter). A filter of this kind is applied as typed, whatever characters it
    has: it is a bound parameter, never part of the SQL."""
    if not isinstance(value, str):
        return None
    found = value.strip()[:max_length]
    return found if found and is_storable_text(found) else None


def identifier(value: object, *, max_length: int = 200) -> str | None:
    """An id this server made (``run_…``, ``msg_…``, an agent's slug): letters, digits and
    ``_.:-``, at most ``max_length`` characters, else None. For ids that go into a link or a
    path, or pick from a list; a filter someone types is ``text``."""
    found = value.strip() if isinstance(value, str) else None
    return found if found and len(found) <= max_length and _ID.fullmatch(found) else None


def agent(value: object) -> str | None:
    """An agent id from a drop-down or the URL (as long as the twins take)."""
    return identifier(value, max_length=AGENT_ID_LENGTH)


def integer(value: object, default: int | None, *, low: int, high: int) -> int | None:
    try:
        number = int(str(value))
    except (TypeError, ValueError):
        return default
    return max(low, min(high, number))


def choice(value: object, allowed, default: str | None = None) -> str | None:
    return value if isinstance(value, str) and value in allowed else default


def day(value: object) -> date | None:
    """A calendar day as a date picker or the URL writes it (``YYYY-MM-DD``; what follows the
    tenth character is ignored), else None."""
    if not isinstance(value, str) or not _DAY.match(value):
        return None
    try:
        return date.fromisoformat(value[:10])
    except ValueError:  # 2026-02-30
        return None


def day_text(value: object) -> str | None:
    """``day`` written back as ``YYYY-MM-DD`` (for the URL and the date picker)."""
    found = day(value)
    return found.isoformat() if found else None


def _start_bound(first: date | None) -> datetime | None:
    """The start of the first day; a day before 1900 is the beginning (no bound), a day after
    9000 the latest bound a twin takes (nothing was created after it)."""
    if first is None:
        return None
    start = datetime.combine(first, time(), UTC)
    return None if start < _FIRST_BOUND else min(start, _LAST_BOUND)


def _end_bound(last: date | None) -> datetime | None:
    """The end of the last day (the next day's start); a last day from 9000-12-31 on is open
    (no bound: its end may not even be a date), a day before 1900 ends at the earliest bound a
    twin takes (nothing was created before it)."""
    if last is None or last >= _LAST_BOUND.date():
        return None
    return max(datetime.combine(last + timedelta(days=1), time(), UTC), _FIRST_BOUND)


def window_key(value: object, default: str = DEFAULT_WINDOW) -> str:
    return choice(value, WINDOW_CHOICES, default) or default


def resolve_window(
    key: str, since: object = None, until: object = None, *, now: datetime | None = None
) -> TimeWindow:
    """A preset relative to now, or ``custom`` whole UTC days from ``since`` to ``until``
    (either may be missing: open at that end), within the years a twin takes as bounds."""
    now = now or datetime.now(UTC)
    if key == "custom":
        return TimeWindow(_start_bound(day(since)), _end_bound(day(until)))
    span = WINDOW_CHOICES.get(key, WINDOW_CHOICES[DEFAULT_WINDOW])[1]
    return TimeWindow(now - span, None) if span is not None else TimeWindow()


def describe_window(key: str, since: object = None, until: object = None) -> str:
    if key == "custom":
        start, end = day(since), day(until)
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


# ---- values a link gave that the page cannot use -------------------------------------------------


def left_out(checks: dict[str, tuple[object, bool]]) -> list[tuple[str, str]]:
    """``(name, value)`` of each query-string value a page could not use (``checks``: name →
    (what the link gave, whether the page took it)), in the order given. Missing and empty
    values are no request; a value is shown cut to 40 characters."""
    return [(name, value.strip()[:40]) for name, (value, taken) in checks.items()
            if isinstance(value, str) and value.strip() and not taken]


def window_checks(window: object, since: object, until: object) -> dict[str, tuple[object, bool]]:
    """``left_out`` checks of the time window's values: a preset the page offers, days that
    are days (the date picker opens on them)."""
    return {"window": (window, choice(window, WINDOW_CHOICES) is not None),
            "since": (since, day(since) is not None), "until": (until, day(until) is not None)}


def whole_number_taken(value: object, *, low: int, high: int) -> bool:
    """Whether ``integer`` uses ``value`` as given (a whole number from ``low`` to ``high``),
    not a default or a bound in its place."""
    try:
        return low <= int(str(value)) <= high
    except ValueError:
        return False
