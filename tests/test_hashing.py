"""agentledger.core.hashing: the text an event's hash covers never changes.

Chains already stored (and evidence bundles already handed out) are verified with today's code,
so the timestamp text and the hash of a given event are pinned here to values computed once.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

from agentledger.core.hashing import (
    canonical_json,
    chained_hashes,
    event_hash,
    event_hash_of_json,
    timestamp_text,
)


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


def _random_json(rng: random.Random, depth: int = 0):
    kinds = ["str", "int", "float", "bool", "none"] + (["list", "dict"] * 2 if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "str":
        # ASCII, control characters (escaped), quotes and backslashes, accents, astral planes.
        alphabet = "ab \"\\/\n\t\x01\x1f\x7fé中\u2028\U0001f600"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(8)))
    if kind == "int":
        return rng.choice((0, -1, rng.randrange(-10**20, 10**20)))
    if kind == "float":
        return rng.choice((0.0, -2.5, 1e-7, 123456.789, 1e15, rng.uniform(-1e6, 1e6)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {_random_json_key(rng): _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def _random_json_key(rng: random.Random) -> str:
    return "".join(rng.choice("bAa_é\"中\n") for _ in range(rng.randrange(1, 5)))


def test_canonical_json_is_json_dumps_sorted_compact_and_unescaped():
    # The text every stored hash covers: what json.dumps spells with these settings, always.
    rng = random.Random(11)
    for _ in range(3000):
        value = _random_json(rng)
        expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert canonical_json(value) == expected, value
    assert canonical_json("héllo\n") == '"héllo\\n"'
    assert canonical_json({"b": [1, 2.5, None, True], "a": {"é": ""}}) \
        == '{"a":{"é":""},"b":[1,2.5,null,true]}'


def test_a_value_that_is_not_json_is_refused():
    with pytest.raises(TypeError, match="not JSON serializable"):
        canonical_json({"when": datetime(2026, 1, 1, tzinfo=UTC)})
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises((ValueError, RecursionError)):
        canonical_json(cyclic)


def test_a_batchs_hashes_are_each_events_own_hash_in_turn():
    moment = datetime(2026, 12, 7, 12, 0, 0, 123456, tzinfo=UTC)
    batch = [("message.delta", canonical_json({"text": f"part {i} é"})) for i in range(5)]
    batch.append(("usage", canonical_json({"input_tokens": 3, "output_tokens": 4})))
    expected, chain = [], "f" * 64
    for seq, (type_, data_json) in enumerate(batch, 7):
        chain = event_hash_of_json(chain, "run_01h", seq, type_, data_json, moment)
        expected.append(chain)
    assert chained_hashes("f" * 64, "run_01h", 7, batch, moment) == expected
    assert chained_hashes("f" * 64, "run_01h", 7, [], moment) == []


def test_canonical_json_uses_the_shared_c_encoder_on_cpython():
    # The fallback keeps the text right on a Python whose private encoder changed; on the
    # Pythons this project supports it must not be taken silently (every event pays for it).
    from agentledger.core import hashing

    assert hashing._C_CANONICAL is not None
