"""Canonical JSON and the hashes built on it: snapshots, idempotency and the event chain.

Shared by the writer (which stores hashes) and ``agentledger verify`` (which recomputes them), so
both sides can never disagree on how an event is serialised.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

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
    body = canonical_json(
        {
            "run_id": run_id,
            "seq": seq,
            "type": type_,
            "data": data,
            "created_at": timestamp_text(created_at),
        }
    )
    return sha256_hex(previous_hash + "\n" + body)
