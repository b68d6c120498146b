"""How deeply a request's JSON may nest: deeper bodies are refused before anything reads them.

Every layer that walks a value (pydantic, the storable copy, canonical JSON, the database
driver) recurses, so a body nested about a thousand levels deep, only a few KB long, would
exhaust the interpreter's recursion limit in one of them and fail as a server error. No
payload the ledger stores needs to nest anywhere near ``MAX_JSON_DEPTH``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from agentledger.core.errors import InvalidRequest

MAX_JSON_DEPTH = 256
# The longest message a run's error holds (``run.failed``, ``agent_run.error``); an agent's own
# failure is cut to it (``agent_kinds.run_context.error_message``) rather than refused.
MAX_ERROR_MESSAGE = 10_000
TOO_DEEP = f"the body nests deeper than {MAX_JSON_DEPTH} levels of objects and arrays"


def nests_too_deep(raw: bytes | str, value: Any) -> bool:
    """Does ``value``, parsed from ``raw``, hold containers more than ``MAX_JSON_DEPTH`` deep?"""
    # A value cannot nest deeper than the number of its opening brackets: most bodies have
    # fewer than the limit and are not walked at all.
    opening = (raw.count(b"[") + raw.count(b"{") if isinstance(raw, bytes)
               else raw.count("[") + raw.count("{"))
    if opening <= MAX_JSON_DEPTH:
        return False
    level = [value]
    for _depth in range(MAX_JSON_DEPTH):
        # One level of containers at a time: a comprehension per level, not a call per node.
        level = [child for node in level
                 for child in (node.values() if type(node) is dict else node)
                 if type(child) is dict or type(child) is list]
        if not level:
            return False
    return True


def parse_json_body(raw: bytes | str) -> Any:
    """``raw`` parsed as JSON; ``InvalidRequest`` for text that is not JSON or that nests
    deeper than ``MAX_JSON_DEPTH`` (before anything else walks it)."""
    try:
        payload = json.loads(raw)
    except RecursionError as exc:
        raise InvalidRequest(TOO_DEEP) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
            # Python's own guard against slow conversions, in words about Python.
            raise InvalidRequest(f"the body holds a number of more than "
                                 f"{sys.get_int_max_str_digits()} digits") from exc
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    if isinstance(payload, dict | list) and nests_too_deep(raw, payload):
        raise InvalidRequest(TOO_DEEP)
    return payload
