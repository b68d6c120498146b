"""Opaque, time-sortable identifiers: ``<prefix>_<26 chars of Crockford base32>`` (ULID layout).

48 bits of milliseconds then 80 random bits, so ids sort by creation time and never collide
across processes without coordination.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_ALPHABET_SET = frozenset(_ALPHABET)
_lock = threading.Lock()
_last_ms = 0
_last_rand = 0
# Every 10-bit value as its two characters: an id is written two characters at a time, which
# takes half the CPU of one at a time (every run, message and thread gets an id).
_PAIRS = tuple(first + second for first in _ALPHABET for second in _ALPHABET)


def _encode(value: int, length: int) -> str:
    """``length`` base32 digits of ``value``, most significant first."""
    text = "".join([_PAIRS[(value >> shift) & 1023]
                    for shift in range((length // 2) * 10 - 10, -1, -10)])
    if length % 2:
        text = _ALPHABET[(value >> (length * 5 - 5)) & 31] + text
    return text


def new_id(prefix: str) -> str:
    """A new id; within one process ids are strictly increasing (monotonic ULID)."""
    global _last_ms, _last_rand
    with _lock:
        now_ms = int(time.time() * 1000)
        if now_ms <= _last_ms:
            now_ms = _last_ms
            rand = (_last_rand + 1) & ((1 << 80) - 1)
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _last_ms, _last_rand = now_ms, rand
    return f"{prefix}_{_encode(now_ms << 80 | rand, 26)}"  # 10 digits of time, 16 random



def id_floor(prefix: str, moment: datetime) -> str:
    """The smallest id of ``prefix`` made at ``moment`` (to the millisecond): every id made at
    or after it sorts at or after this string, every id made before it sorts before."""
    ms = int(moment.timestamp() * 1000)
    return f"{prefix}_{_encode(ms, 10)}"


def id_time(value: str) -> datetime | None:
    """When the id was made, or None if ``value`` is not an id of this layout."""
    _prefix, sep, body = value.rpartition("_")
    if not sep or len(body) != 26 or not set(body) <= _ALPHABET_SET:
        return None
    ms = 0
    for char in body[:10]:
        ms = ms * 32 + _ALPHABET.index(char)
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, ValueError):
        return None
