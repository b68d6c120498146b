"""The per-agent outcome rollups (``agent_outcome_rollup`` per UTC day of creation,
``agent_outcome_rollup_hour`` per UTC hour and ``agent_outcome_rollup_minute`` per UTC minute
of the last two days, ``agentledger.core.rollup_periods``), kept in step with run endings.

``append_events`` calls ``record_run_end`` in the transaction that appends a run's terminal
event; ``bulk_import`` adds whole batches through ``RollupBatch``. A run is counted under its
frozen agent version, the UTC day and hour it was *created* (what the read side's windows
select runs by) and its terminal status. Tokens and cost are summed from the run's ``usage``
events when it ends (a run with an unpriced call counts in ``runs_without_cost``, not as free):
a terminal event is always the last one, so that sum is final, and a run that has not ended is
not in the rollup at all (the read side adds those few live runs itself).

Run endings spread over ``ROLLUP_SHARDS`` rows per key; ``fold_shards`` (the reconciler loop,
every few minutes) folds the shard rows of periods that are over into shard 0, so a read of a
month sums a row per key and day, not up to sixteen; ``prune_minutes`` (the same loop) deletes
the minutes no longer kept.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import delete, select, text, tuple_
from sqlalchemy.orm import Session

from agentledger.core import dialect
from agentledger.core.outcome_histogram import LATENCY_COLUMNS, WAIT_COLUMNS
from agentledger.core.outcome_sums import OutcomeSums, usage_totals
from agentledger.core.rollup_periods import (
    day_of,
    hour_of,
    minute_of,
    minutes_kept_from,
)
from agentledger.core.schema import (
    AgentOutcomeRollup,
    AgentOutcomeRollupHour,
    AgentOutcomeRollupMinute,
    AgentRun,
    RunEvent,
    RunInterruptionCount,
)
from agentledger.core.vocabulary import TERMINAL

ROLLUP = AgentOutcomeRollup.__table__
ROLLUP_HOUR = AgentOutcomeRollupHour.__table__
ROLLUP_MINUTE = AgentOutcomeRollupMinute.__table__
INTERRUPTIONS = RunInterruptionCount.__table__
KEY = ["agent_id", "agent_version", "day", "status", "shard"]
HOUR_KEY = ["agent_id", "agent_version", "hour", "status", "shard"]
MINUTE_KEY = ["agent_id", "agent_version", "minute", "status", "shard"]
# The three rollups, coarsest first: the order every writer adds to them and locks their rows.
TABLES = ((ROLLUP, KEY), (ROLLUP_HOUR, HOUR_KEY), (ROLLUP_MINUTE, MINUTE_KEY))
# Rows per (agent, version, day, status) that single run endings spread over, so concurrent
# endings of one busy agent rarely wait on each other's row lock (readers sum the shards).
ROLLUP_SHARDS = 16


def rollup_shard(run_id: str) -> int:
    """The shard a run's ending is counted in: stable, and spread evenly over run ids."""
    return zlib.crc32(run_id.encode()) % ROLLUP_SHARDS


@dataclass(frozen=True)
class RunOutcome:
    agent_id: str
    agent_version: int
    status: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0  # None: a call of the run had no price
    end_reason: str | None = None  # why an ``interrupted`` run ended

    @property
    def latency(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    @property
    def wait(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.started_at - self.created_at).total_seconds()


def _periods_of(outcome: RunOutcome, minutes_from: datetime | None) -> list[date]:
    """The periods an ended run counts in, one per table of ``TABLES``: the UTC day and hour
    of its creation, and its minute if it was created since ``minutes_from`` (None: no
    minute)."""
    if outcome.status not in TERMINAL:
        raise ValueError(f"only ended runs are rolled up, not {outcome.status}")
    created = outcome.created_at
    periods: list[date] = [day_of(created), hour_of(created)]
    if minutes_from is not None and created >= minutes_from:
        periods.append(minute_of(created))
    return periods


def _accumulate(row: OutcomeSums, outcome: RunOutcome) -> None:
    row.add_run(outcome.status, outcome.latency, outcome.wait)
    row.add_usage(outcome.input_tokens, outcome.output_tokens, outcome.cost_usd)


class RollupBatch:
    """Ended runs summed in memory per rollup key (a day row, an hour row and, for a run
    created since ``minutes_from``, a minute row each), then written with one upsert per
    table, sent together."""

    def __init__(self, *, minutes_from: datetime | None) -> None:
        """``minutes_from``: the oldest creation time added to the minute rollup
        (``rollup_periods.minutes_kept_from`` of the moment the batch is written); None: no
        minute rows."""
        self.minutes_from = minutes_from
        # (agent_id, agent_version, period, status, shard): the period is the UTC day (a date)
        # in ``days`` and the UTC hour or minute (a datetime, which is a date too) in the others
        self.days: dict[tuple[str, int, date, str, int], OutcomeSums] = {}
        self.hours: dict[tuple[str, int, date, str, int], OutcomeSums] = {}
        self.minutes: dict[tuple[str, int, date, str, int], OutcomeSums] = {}
        self.interruptions: Counter[str] = Counter()

    def add(self, outcome: RunOutcome, *, shard: int = 0) -> None:
        if outcome.status == "interrupted" and outcome.end_reason is not None:
            self.interruptions[outcome.end_reason] += 1
        periods = _periods_of(outcome, self.minutes_from)
        for rows, period in zip((self.days, self.hours, self.minutes), periods, strict=False):
            key = (outcome.agent_id, outcome.agent_version, period, outcome.status, shard)
            row = rows.get(key)
            if row is None:
                row = rows[key] = OutcomeSums()
            _accumulate(row, outcome)

    def write(self, session: Session) -> None:
        """One upsert per table, in one round trip (keys sorted, tables coarsest first:
        concurrent writers lock in one order)."""
        parts = [(table, key_columns, rows) for (table, key_columns), rows
                 in zip(TABLES, (self.days, self.hours, self.minutes), strict=True)]
        _upsert(session, parts)
        for _table, _key_columns, rows in parts:
            rows.clear()
        count_interruptions(session, self.interruptions)
        self.interruptions.clear()


_LEAST = ("latency_min", "wait_min")
_GREATEST = ("latency_max", "wait_max")


def _upsert(session: Session, parts: list[tuple]) -> None:
    """``(table, key_columns, {key: sums})`` parts, added together."""
    dialect.upsert_adding_together(
        session, [(table, key_columns, _rows(key_columns, sums)) for table, key_columns, sums in parts],
        least=_LEAST, greatest=_GREATEST)


def _scalars(row: OutcomeSums) -> dict:
    """A rollup row's columns other than its key and its histograms."""
    return dict(
        runs=row.runs, latency_n=row.latency.n, latency_sum=float(row.latency.total),
        wait_n=row.wait.n, wait_sum=float(row.wait.total), input_tokens=row.input_tokens,
        output_tokens=row.output_tokens, cost_usd=float(row.cost_usd),
        runs_without_cost=row.runs_without_cost,
        latency_min=row.latency.min, latency_max=row.latency.max,
        wait_min=row.wait.min, wait_max=row.wait.max,
    )


def _rows(key_columns: list[str], rows: dict[tuple, OutcomeSums]) -> list[dict]:
    # Every histogram column, zeros included: one statement shape per table, built and
    # compiled once (naming only the buckets a batch touched made thousands of shapes).
    values = []
    for key in sorted(rows):
        row = rows[key]
        item = dict(zip(key_columns, key, strict=True))
        item.update(_scalars(row))
        item.update(zip(LATENCY_COLUMNS, row.latency.histogram, strict=True))
        item.update(zip(WAIT_COLUMNS, row.wait.histogram, strict=True))
        values.append(item)
    return values


# A single run's latency and wait each count in one histogram bucket: its row names the
# bucket, and the database writes the 1 and the zeros (``dialect.upsert_adding_one``).
_ONE_HOT = (("latency_bucket", LATENCY_COLUMNS), ("wait_bucket", WAIT_COLUMNS))


def record_run_end(session: Session, outcome: RunOutcome, *, shard: int = 0) -> None:
    """Add one ended run to the rollups (called by ``append_events`` in the ending transaction,
    with the run's ``rollup_shard``; its ending moment is the "now" the minute rollup keeps
    runs from). The same sums as a ``RollupBatch`` of that one run, in one row per table."""
    periods = _periods_of(outcome, minutes_kept_from(outcome.finished_at))
    sums = OutcomeSums()
    _accumulate(sums, outcome)
    values = _scalars(sums)
    values["latency_bucket"] = _the_bucket(sums.latency.histogram)
    values["wait_bucket"] = _the_bucket(sums.wait.histogram)
    parts = []
    for (table, key_columns), period in zip(TABLES, periods, strict=False):
        key = (outcome.agent_id, outcome.agent_version, period, outcome.status, shard)
        parts.append((table, key_columns, {**dict(zip(key_columns, key, strict=True)), **values}))
    dialect.upsert_adding_one(session, parts, one_hot=_ONE_HOT, least=_LEAST, greatest=_GREATEST)
    if outcome.status == "interrupted" and outcome.end_reason is not None:
        count_interruptions(session, {outcome.end_reason: 1})


def count_interruptions(session: Session, runs_by_reason: Mapping[str, int]) -> None:
    """Add interrupted runs to ``run_interruption_count`` (``agentledger_runs_interrupted_total``),
    which archiving never lowers."""
    if runs_by_reason:
        dialect.upsert_adding(session, INTERRUPTIONS, ["reason"], [
            {"reason": reason, "runs": runs} for reason, runs in sorted(runs_by_reason.items())])


def _the_bucket(histogram: list[int]) -> int | None:
    """The one bucket a single run's histogram counts in (None: no such duration)."""
    return histogram.index(1) if any(histogram) else None


def rebuild_rollup(session: Session, *, chunk: int = 5000, now: datetime | None = None) -> int:
    """Recompute the whole rollup (the minutes kept at ``now``) from ``agent_run`` and
    ``run_event``; returns runs counted.

    For repairs; live traffic never needs it. ``run_interruption_count`` is left as it is: it
    also counts runs that archiving has moved out of ``agent_run``.
    """
    minutes_from = minutes_kept_from(now or datetime.now(UTC))
    for table, _key in TABLES:
        session.execute(delete(table))
    counted, after = 0, ""
    while True:
        runs = session.execute(
            select(AgentRun.id, AgentRun.agent_id, AgentRun.agent_version, AgentRun.status,
                   AgentRun.created_at, AgentRun.started_at, AgentRun.finished_at)
            .where(AgentRun.status.in_(TERMINAL), AgentRun.id > after)
            .order_by(AgentRun.id).limit(chunk)
        ).all()
        if not runs:
            return counted
        usage: dict[str, list[dict]] = {}
        for run_id, data in session.execute(
            select(RunEvent.run_id, RunEvent.data)
            .where(RunEvent.run_id.in_([r.id for r in runs]), RunEvent.type == "usage")
            .order_by(RunEvent.run_id, RunEvent.seq)
        ):
            usage.setdefault(run_id, []).append(data)
        batch = RollupBatch(minutes_from=minutes_from)
        for r in runs:
            tokens_in, tokens_out, cost = usage_totals(usage.get(r.id, ()))
            batch.add(RunOutcome(r.agent_id, r.agent_version, r.status, r.created_at,
                                 r.started_at, r.finished_at or r.created_at,
                                 tokens_in, tokens_out, cost))
        batch.write(session)
        counted += len(runs)
        after = runs[-1].id


# Taken by ``fold_shards`` on PostgreSQL, so the reconciler loops of every server and worker
# process do not fold the same rows at once (the others skip their turn).
_FOLD_LOCK = 7243110001
FOLD_BATCH = 2000  # shard rows per table and transaction: a long history folds in short steps
FOLD_GRACE = timedelta(minutes=5)  # an hour is folded once it has been over this long


def fold_shards(session: Session, *, settled_before: datetime, limit: int = FOLD_BATCH) -> int:
    """Fold the shard rows (shard > 0) of the days, hours and minutes that were over by
    ``settled_before`` into their key's shard 0, at most ``limit`` rows of each table, oldest
    first; returns the rows folded (``limit`` or more while a table has rows left to fold).

    Sharding keeps concurrent run endings off one row lock, but a read sums every shard row of
    its days and hours: unfolded, a month read sixteen times the rows. Folding is exact at any
    moment: each shard row is deleted (``RETURNING`` its sums, under its row lock) and added to
    shard 0 in one transaction, so a run ending concurrently either updated the row before it
    was deleted (and is folded with it) or waits for this transaction and then inserts a fresh
    shard row (folded by a later pass). A run created in a period that is over and ending later
    does exactly that. Days are folded before hours and hours before minutes, the order run
    endings lock them in.
    """
    if dialect.name(session) == "postgresql" and not session.execute(
            text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": _FOLD_LOCK}).scalar_one():
        return 0  # another process is folding now
    settled = settled_before.astimezone(UTC)
    folded = 0
    for (table, key_columns), bound in zip(
            TABLES, (day_of(settled), hour_of(settled), minute_of(settled)), strict=True):
        period, key = table.c[key_columns[2]], [table.c[c] for c in key_columns]
        oldest = (select(*key).where(table.c.shard != 0, period < bound)
                  .order_by(period).limit(limit))
        moved = session.execute(
            delete(table).where(tuple_(*key).in_(oldest)).returning(*table.c)
        ).mappings().all()
        sums: dict[tuple, OutcomeSums] = {}
        for row in moved:
            key = (*(row[c] for c in key_columns[:-1]), 0)
            found = sums.get(key)
            if found is None:
                sums[key] = OutcomeSums.of_rollup_row(row)
            else:
                found.merge(OutcomeSums.of_rollup_row(row))
        if sums:
            _upsert(session, [(table, key_columns, sums)])
        folded += len(moved)
    return folded


def fold_settled_shards(session: Session, now: datetime | None = None,
                        limit: int = FOLD_BATCH) -> int:
    """``fold_shards`` of the periods over by ``FOLD_GRACE`` (the endings of their last runs,
    mostly seconds after they start, have come in by then)."""
    return fold_shards(session, settled_before=(now or datetime.now(UTC)) - FOLD_GRACE,
                       limit=limit)


PRUNE_BATCH = 5000  # minute rows per transaction: a backlog is deleted in short steps


def prune_minutes(session: Session, now: datetime | None = None, limit: int = PRUNE_BATCH) -> int:
    """Delete at most ``limit`` minute rollup rows older than the minutes kept at ``now``
    (oldest first); returns the rows deleted (``limit`` while older ones are left).

    Readers never use those minutes (``rollup_periods.minutes_readable_from``), so deleting
    them changes no answer."""
    kept_from = minute_of(minutes_kept_from(now or datetime.now(UTC)))
    table = ROLLUP_MINUTE
    key = [table.c[c] for c in MINUTE_KEY]
    oldest = select(*key).where(table.c.minute < kept_from).order_by(table.c.minute).limit(limit)
    result = session.execute(delete(table).where(tuple_(*key).in_(oldest)))
    return int(getattr(result, "rowcount", 0) or 0)
