"""The sums per-agent outcomes are made of, shared by the writer (``ingest.rollup``, which adds
each ended run to a rollup row) and the reader (``queries.outcomes``, which adds rollup rows and
the few runs it scans), so both count a run the same way.

Cost is summed over the runs whose cost is known; a run with a ``usage`` event whose
``cost_usd`` is null (no price known for its model) counts in ``runs_without_cost`` instead, so a
sum never passes an unknown cost off as zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agentledger.core.outcome_histogram import BUCKETS, LATENCY_COLUMNS, WAIT_COLUMNS, bucket_of

# A run's token sums stop here: 9,000 times below the 64-bit columns that hold them and their
# per-agent sums, so that a run's ending can always store its totals. Reaching it takes a
# thousand usage events at the largest count one may carry (``ingest.event_types``).
RUN_TOKENS_MAX = 10**15


def usage_totals(datas: Iterable[dict]) -> tuple[int, int, float | None]:
    """(input tokens, output tokens, cost) of one run's ``usage`` event data; cost is None
    when any call of the run had no price (``cost_usd`` null or absent). Token sums saturate at
    ``RUN_TOKENS_MAX``."""
    tokens_in = tokens_out = 0
    cost: float | None = 0.0
    for d in datas:
        tokens_in += int(d.get("input_tokens") or 0)
        tokens_out += int(d.get("output_tokens") or 0)
        value = d.get("cost_usd")
        if value is None:
            cost = None
        elif cost is not None:
            cost += float(value)
    return min(tokens_in, RUN_TOKENS_MAX), min(tokens_out, RUN_TOKENS_MAX), cost


def _lower(a: float | None, b: float | None) -> float | None:
    return a if b is None or (a is not None and a <= b) else b


def _higher(a: float | None, b: float | None) -> float | None:
    return a if b is None or (a is not None and a >= b) else b


@dataclass
class Durations:
    """Count, sum, extremes and log-scale histogram of one kind of duration (seconds)."""

    n: int = 0
    total: float = 0.0
    min: float | None = None
    max: float | None = None
    histogram: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def add(self, seconds: float) -> None:
        self.n += 1
        self.total += seconds
        self.min, self.max = _lower(self.min, seconds), _higher(self.max, seconds)
        self.histogram[bucket_of(seconds)] += 1

    def add_summed(self, total: float, low: float | None, high: float | None,
                   buckets: list[int]) -> None:
        """Durations already summed elsewhere (by the database), given by each one's bucket."""
        self.n += len(buckets)
        self.total += total
        self.min, self.max = _lower(self.min, low), _higher(self.max, high)
        histogram = self.histogram
        for bucket in buckets:
            histogram[bucket] += 1

    def add_counted(self, n: int, total: float, low: float | None, high: float | None,
                    counts) -> None:
        """Durations already summed elsewhere (a rollup row or a sum of them), given by their
        count, sum, extremes and bucket counts; added in place (a read adds hundreds of rows)."""
        self.n += n
        self.total += total
        self.min, self.max = _lower(self.min, low), _higher(self.max, high)
        histogram = self.histogram
        for index, count in enumerate(counts):
            if count:
                histogram[index] += count

    def merge(self, other: Durations) -> None:
        self.add_counted(other.n, other.total, other.min, other.max, other.histogram)

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


@dataclass
class OutcomeSums:
    """Runs of one group (an agent version, a rollup key, …): counts by status, latency
    (started → finished), queue wait (created → started), tokens and known cost."""

    runs: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    latency: Durations = field(default_factory=Durations)
    wait: Durations = field(default_factory=Durations)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    runs_without_cost: int = 0

    def add_run(self, status: str, latency: float | None, wait: float | None) -> None:
        self.runs += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if latency is not None:
            self.latency.add(latency)
        if wait is not None:
            self.wait.add(wait)

    def add_usage(self, input_tokens: int, output_tokens: int, cost_usd: float | None) -> None:
        """One run's usage totals (``usage_totals``)."""
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        if cost_usd is None:
            self.runs_without_cost += 1
        else:
            self.cost_usd += cost_usd

    def add_usage_sums(self, input_tokens: int | None, output_tokens: int | None,
                       known_cost: float | None, runs_without_cost: int) -> None:
        """Usage already summed over several runs (by the database; a sum over no rows is
        None): ``known_cost`` over the runs with a known cost, the others counted apart."""
        self.input_tokens += int(input_tokens or 0)
        self.output_tokens += int(output_tokens or 0)
        self.cost_usd += float(known_cost or 0.0)
        self.runs_without_cost += runs_without_cost

    def merge(self, other: OutcomeSums) -> None:
        self.runs += other.runs
        for status, n in other.by_status.items():
            self.by_status[status] = self.by_status.get(status, 0) + n
        self.latency.merge(other.latency)
        self.wait.merge(other.wait)
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost_usd += other.cost_usd
        self.runs_without_cost += other.runs_without_cost

    @classmethod
    def of_rollup_row(cls, row: Mapping) -> OutcomeSums:
        """The sums one stored rollup row holds (its columns by name; ``status`` and ``runs``
        give the count by status)."""
        return cls(
            runs=row["runs"], by_status={row["status"]: row["runs"]},
            latency=Durations(row["latency_n"], row["latency_sum"], row["latency_min"],
                              row["latency_max"], [row[c] for c in LATENCY_COLUMNS]),
            wait=Durations(row["wait_n"], row["wait_sum"], row["wait_min"], row["wait_max"],
                           [row[c] for c in WAIT_COLUMNS]),
            input_tokens=row["input_tokens"], output_tokens=row["output_tokens"],
            cost_usd=row["cost_usd"], runs_without_cost=row["runs_without_cost"],
        )

    @property
    def known_cost(self) -> float | None:
        """The summed cost, or None when no run of the group had a known cost."""
        if self.runs and self.runs_without_cost >= self.runs:
            return None
        return self.cost_usd
