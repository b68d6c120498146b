"""Fixed log-scale histogram buckets for the per-agent outcome rollup.

Shared by the writer (``ingest.rollup``, which counts each ended run's latency and queue wait
into one bucket each) and the reader (``queries.agent_outcomes``, which estimates percentiles
from summed buckets), so both always agree on the bucket of a value.

Bucket 0 holds values below 10 ms; bucket ``i`` (1 ≤ i < 63) holds ``[10 ms·r^(i-1), 10 ms·r^i)``
with ``r = 2^(1/3)`` (each bucket is 26 % wider than the one before); bucket 63 holds everything
from about 4.6 hours up. An estimate therefore lies within one bucket width (≤ 26 %) of the
true percentile, and is clamped to the observed minimum and maximum, which the rollup keeps too.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

BUCKETS = 64
FIRST_EDGE = 0.01  # seconds
RATIO = 2 ** (1 / 3)
_LOG_RATIO = math.log(RATIO)

# upper edge of every bucket but the last (which is open)
EDGES = tuple(FIRST_EDGE * RATIO**i for i in range(BUCKETS - 1))

LATENCY_COLUMNS = tuple(f"latency_h{i:02d}" for i in range(BUCKETS))
WAIT_COLUMNS = tuple(f"wait_h{i:02d}" for i in range(BUCKETS))


def bucket_of(seconds: float) -> int:
    """The bucket that counts ``seconds`` (negative durations, from clock skew, count as 0)."""
    if seconds < FIRST_EDGE:
        return 0
    index = int(math.log(seconds / FIRST_EDGE) / _LOG_RATIO) + 1
    # Guard the floating-point edges so that bucket_of agrees with EDGES exactly.
    if index < BUCKETS and index >= 1 and seconds < EDGES[index - 1]:
        index -= 1
    elif index < BUCKETS - 1 and seconds >= EDGES[index]:
        index += 1
    return min(index, BUCKETS - 1)


def bucket_bounds(index: int, maximum: float | None = None) -> tuple[float, float]:
    low = 0.0 if index == 0 else EDGES[index - 1]
    if index < BUCKETS - 1:
        return low, EDGES[index]
    return low, max(low, maximum if maximum is not None else low * RATIO)


def estimate_percentiles(
    counts: Sequence[int],
    fractions: Sequence[float],
    minimum: float | None,
    maximum: float | None,
) -> list[float | None]:
    """Percentiles (``percentile_cont`` ranks) estimated from bucket counts.

    The ``c`` values of a bucket are assumed evenly spread inside it; the value at a fractional
    rank interpolates linearly between its two neighbouring ranks, like ``percentile_cont``.
    Results are clamped to ``[minimum, maximum]``, so one value, or all values in one bucket
    with equal extremes, come out exact.
    """
    # counts up to and including each bucket: a rank's bucket is the first whose count
    # passes it, found by bisection rather than by walking the buckets at every rank
    cumulative = list(itertools.accumulate(counts))
    total = cumulative[-1] if cumulative else 0
    if total == 0:
        return [None for _ in fractions]

    def value_at(rank: int) -> float:
        index = bisect.bisect_right(cumulative, rank)  # rank < total: always a bucket
        c = counts[index]
        seen = cumulative[index] - c
        low, high = bucket_bounds(index, maximum)
        if minimum is not None:
            low = max(low, min(minimum, high))
        if maximum is not None:
            high = min(high, max(maximum, low))
        return low + (high - low) * ((rank - seen) + 0.5) / c

    found: list[float | None] = []
    for fraction in fractions:
        position = (total - 1) * fraction
        below, above = math.floor(position), math.ceil(position)
        value = value_at(below)
        if above != below:
            value += (value_at(above) - value) * (position - below)
        if minimum is not None:
            value = max(value, minimum)
        if maximum is not None:
            value = min(value, maximum)
        found.append(value)
    return found
