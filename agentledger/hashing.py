"""Canonical JSON and the hashes built on it: snapshots, idempotency and the event chain.

Shared by the writer (which stores hashes) and ``agentledger verify`` (which recomputes them), so
both sides can never disagree on how an event is serialised.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from agentledger.errors import ValidationFailed

GENESIS_HASH = "0" * 64


def canonical_json(value: Any) -> str:
    """Key-sorted, whitespace-free, UTF-8 JSON: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def timestamp_text(moment: datetime) -> str:
    """Microsecond UTC text, the precision both databases store."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_hash(
    previous_hash: str, run_id: str, seq: int, type_: str, data: Any, created_at: datetime
) -> str:
    """The chained hash of one event: any change to it or to an earlier event changes it."""
    return event_hash_of_json(previous_hash, run_id, seq, type_, canonical_json(data), created_at)


def event_hash_of_json(
    previous_hash: str, run_id: str, seq: int, type_: str, data_json: str, created_at: datetime
) -> str:
    """``event_hash`` for data already serialised with ``canonical_json`` (bulk imports reuse
    that text as the stored JSON). The body is the canonical JSON of
    ``{run_id, seq, type, data, created_at}``, written out here in its sorted key order."""
    body = (
        '{"created_at":' + canonical_json(timestamp_text(created_at))
        + ',"data":' + data_json
        + ',"run_id":' + canonical_json(run_id)
        + ',"seq":' + canonical_json(seq)
        + ',"type":' + canonical_json(type_) + "}"
    )
    return sha256_hex(previous_hash + "\n" + body)


def storable_json(value: Any, where: str) -> Any:
    """``value`` exactly as both databases give it back, so its hash verifies after a round trip.

    PostgreSQL's jsonb keeps numbers as ``numeric``: it has no ``-0.0``, and a float written with
    an exponent of 16 or more (``1e+16``) comes back as an integer. Text may not contain NUL or
    lone surrogates, and NaN/Infinity are not JSON: those are refused on both databases.
    """
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationFailed(f"{where}: numbers must be finite")
        if value == 0:
            return 0.0
        if abs(value) >= 1e16:
            return int(Decimal(repr(value)))
        return value
    if isinstance(value, str):
        if "\x00" in value or any("\ud800" <= c <= "\udfff" for c in value):
            raise ValidationFailed(f"{where}: text may not contain NUL or lone surrogates")
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationFailed(f"{where}: object keys must be strings")
            storable_json(key, where)
            out[key] = storable_json(item, f"{where}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [storable_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise ValidationFailed(f"{where}: {type(value).__name__} is not a JSON value")
