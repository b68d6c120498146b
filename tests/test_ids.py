"""agentledger.core.ids: ULID-layout ids in Crockford base32, time-sortable and monotonic."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from agentledger.core import ids

CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def digits(value: int, length: int) -> str:
    """The reference: base32 digits by repeated division, most significant first."""
    out = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        out.append(CROCKFORD[digit])
    assert value == 0, "the value does not fit"
    return "".join(reversed(out))


def test_the_encoding_is_crockford_base32_of_the_value():
    rng = random.Random(3)
    for length in (1, 2, 7, 8, 10, 16, 26):
        top = (1 << (5 * length)) - 1
        for value in (0, 1, 31, top, top - 1, *(rng.randint(0, top) for _ in range(200))):
            assert ids._encode(value, length) == digits(value, length), (value, length)


def test_an_id_is_milliseconds_then_randomness_and_sorts_by_creation():
    made = [ids.new_id("run") for _ in range(2000)]
    assert made == sorted(made) and len(set(made)) == len(made)  # monotonic within a process
    prefix, _, body = made[0].rpartition("_")
    assert prefix == "run" and len(body) == 26 and set(body) <= set(CROCKFORD)
    made_at = ids.id_time(made[0])
    assert made_at is not None
    assert abs(made_at - datetime.now(UTC)) < timedelta(seconds=5)


def test_the_floor_of_a_moment_sorts_between_the_ids_before_and_after_it():
    moment = datetime(2026, 12, 4, 12, 0, 0, 123000, tzinfo=UTC)
    floor = ids.id_floor("run", moment)
    assert ids.id_time(floor + "0" * 16) == moment
    ms = int(moment.timestamp() * 1000)
    just_before = f"run_{digits(ms - 1, 10)}{'z' * 16}"
    at_it = f"run_{digits(ms, 10)}{'0' * 16}"
    assert just_before < floor <= at_it
    assert ids.id_time("run_not-an-id") is None
