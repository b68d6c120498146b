"""Agent ``params`` that every kind understands, read by the executor and the read side alike.

- ``history_limit``: how many earlier turns of its thread a run receives (CONTRACT §7).
"""

from __future__ import annotations

from typing import Any

DEFAULT_HISTORY_LIMIT = 50
MAX_HISTORY_LIMIT = 1000


def _valid_limit(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value <= MAX_HISTORY_LIMIT


def history_limit(params: dict[str, Any] | None) -> int:
    """``params.history_limit`` of an agent definition (validated at registration), or 50."""
    value = (params or {}).get("history_limit", DEFAULT_HISTORY_LIMIT)
    return value if _valid_limit(value) else DEFAULT_HISTORY_LIMIT


def validate_history_limit(params: dict[str, Any]) -> None:
    """Raise ``ValueError`` with a sentence for a ``history_limit`` no run could use."""
    if "history_limit" in params and not _valid_limit(params["history_limit"]):
        raise ValueError(f"params.history_limit must be an integer from 0 to {MAX_HISTORY_LIMIT}")
