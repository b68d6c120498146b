"""agentledger.core.hashing: the text an event's hash covers never changes.

Chains already stored (and evidence bundles already handed out) are verified with today's code,
so the timestamp text and the hash of a given event are pinned here to values computed once.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

from agentledger.core.hashing import event_hash, timestamp_text


def reference_text(moment: datetime) -> str:
    """Microsecond UTC text as ``strftime`` spells it (four-digit years from 1000 on)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_an_events_hash_is_the_one_computed_when_the_chain_was_written():
    moment = datetime(2026, 12, 6, 16, 5, 9, 70001, tzinfo=timezone(timedelta(hours=2)))
    digest = event_hash("0" * 64, "run_01h", 3, "message.delta", {"text": "héllo"}, moment)
    assert digest == "aaab85d4050f1f856b61c1d8c28a9cf414a134327df7ca16b3a65dd27f871dc2"


def test_timestamp_text_is_utc_to_the_microsecond():
    assert timestamp_text(datetime(2026, 12, 6, 16, 5, 9, 70001,
                                   tzinfo=timezone(timedelta(hours=2)))) == "2026-12-06T14:05:09.070001Z"
    assert timestamp_text(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05.000000Z"
    assert timestamp_text(datetime(1000, 1, 2, 3, 4, 5, tzinfo=UTC)) == "1000-01-02T03:04:05.000000Z"
    assert timestamp_text(datetime(999, 1, 2, 3, 4, 5, 6, tzinfo=UTC)) == "999-01-02T03:04:05.000006Z"
    assert timestamp_text(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) \
        == "9999-12-31T23:59:59.999999Z"


def test_timestamp_text_agrees_with_strftime_for_any_moment_and_offset():
    rng = random.Random(5)
    start = datetime(1000, 1, 1, 12, tzinfo=UTC)
    span = (datetime(9999, 12, 30, tzinfo=UTC) - start).total_seconds()
    for _ in range(5000):
        moment = start + timedelta(seconds=rng.uniform(0, span),
                                   microseconds=rng.choice((0, rng.randrange(1_000_000))))
        zone = timezone(timedelta(minutes=rng.randrange(-12 * 60, 12 * 60 + 1, 15)))
        local = moment.astimezone(zone)
        assert timestamp_text(local) == reference_text(moment), local
