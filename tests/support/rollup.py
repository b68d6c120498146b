"""The outcome rollup recomputed by a full scan of ``agent_run`` / ``run_event``, for tests."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select

from agentledger.core.outcome_histogram import BUCKETS, LATENCY_COLUMNS, WAIT_COLUMNS, bucket_of
from agentledger.core.rollup_periods import MINUTE_ROLLUP_KEPT, minute_of, minutes_kept_from
from agentledger.core.schema import (
    AgentOutcomeRollup,
    AgentOutcomeRollupHour,
    AgentOutcomeRollupMinute,
    AgentRun,
    RunEvent,
)
from agentledger.core.vocabulary import TERMINAL


def _empty() -> dict:
    return {"runs": 0, "latency_n": 0, "latency_sum": 0.0, "latency_min": None,
            "latency_max": None, "wait_n": 0, "wait_sum": 0.0, "wait_min": None, "wait_max": None,
            "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "runs_without_cost": 0,
            "latency_h": [0] * BUCKETS, "wait_h": [0] * BUCKETS}


def _period(moment, by: str):
    if by == "day":
        return moment.date()
    if by == "minute":
        return minute_of(moment)
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


TABLES = {"day": AgentOutcomeRollup, "hour": AgentOutcomeRollupHour,
          "minute": AgentOutcomeRollupMinute}


def scanned(db, by: str = "day", *, minutes_from=None) -> dict:
    """{(agent, version, day, hour or minute, status): sums} from every ended run, read
    straight from the tables. By minute, only the runs the minute rollup keeps: created since
    ``minutes_from`` (as a bulk import or a rebuild adds them), or (None) within
    ``MINUTE_ROLLUP_KEPT`` before they ended (as the live path does)."""
    with db.read() as s:
        runs = s.execute(select(AgentRun.id, AgentRun.agent_id, AgentRun.agent_version,
                                AgentRun.status, AgentRun.created_at, AgentRun.started_at,
                                AgentRun.finished_at).where(AgentRun.status.in_(TERMINAL))).all()
        usage: dict[str, list[dict]] = {}
        for run_id, data in s.execute(select(RunEvent.run_id, RunEvent.data)
                                      .where(RunEvent.type == "usage")
                                      .order_by(RunEvent.run_id, RunEvent.seq)):
            usage.setdefault(run_id, []).append(data)
    found: dict = {}
    for r in runs:
        if by == "minute" and r.created_at < (minutes_from or r.finished_at - MINUTE_ROLLUP_KEPT):
            continue
        row = found.setdefault((r.agent_id, r.agent_version, _period(r.created_at, by), r.status),
                               _empty())
        row["runs"] += 1
        costs = []
        for d in usage.get(r.id, ()):
            row["input_tokens"] += d["input_tokens"]
            row["output_tokens"] += d["output_tokens"]
            costs.append(d.get("cost_usd"))
        # A run with an unpriced call has an unknown cost: counted apart, never as zero.
        if None in costs:
            row["runs_without_cost"] += 1
        else:
            row["cost_usd"] += sum(costs)
        if r.started_at is not None:
            for name, value in (("latency", (r.finished_at - r.started_at).total_seconds()),
                                ("wait", (r.started_at - r.created_at).total_seconds())):
                row[f"{name}_n"] += 1
                row[f"{name}_sum"] += value
                row[f"{name}_min"] = value if row[f"{name}_min"] is None else min(row[f"{name}_min"], value)
                row[f"{name}_max"] = value if row[f"{name}_max"] is None else max(row[f"{name}_max"], value)
                row[f"{name}_h"][bucket_of(value)] += 1
    return found


def stored(db, by: str = "day") -> dict:
    table = TABLES[by].__table__
    with db.read() as s:
        rows = s.execute(select(table)).mappings().all()
    found: dict = {}
    for r in rows:
        # The rows of one key are shards of one count: the stored value is their merge.
        key = (r["agent_id"], r["agent_version"], r[by], r["status"])
        row = found.setdefault(key, _empty())
        for name in ("runs", "latency_n", "latency_sum", "wait_n", "wait_sum", "input_tokens",
                     "output_tokens", "cost_usd", "runs_without_cost"):
            row[name] += r[name]
        for name, pick in (("latency_min", min), ("wait_min", min), ("latency_max", max),
                           ("wait_max", max)):
            if r[name] is not None:
                row[name] = r[name] if row[name] is None else pick(row[name], r[name])
        row["latency_h"] = [a + r[c] for a, c in zip(row["latency_h"], LATENCY_COLUMNS, strict=True)]
        row["wait_h"] = [a + r[c] for a, c in zip(row["wait_h"], WAIT_COLUMNS, strict=True)]
    return found


def assert_usage_totals_match_events(db, *, recorded: bool = True) -> int:
    """Every ended run's recorded usage totals (``agent_run.usage_*``) equal its usage events'
    (cost None when a call had no price); a run that has not ended has none, and with
    ``recorded=False`` (runs that ended before migration 0014) no run has any. Returns the
    ended runs checked."""
    with db.read() as s:
        runs = s.execute(select(AgentRun.id, AgentRun.status, AgentRun.usage_input_tokens,
                                AgentRun.usage_output_tokens, AgentRun.usage_cost_usd)).all()
        usage: dict[str, list[dict]] = {}
        for run_id, data in s.execute(select(RunEvent.run_id, RunEvent.data)
                                      .where(RunEvent.type == "usage")
                                      .order_by(RunEvent.run_id, RunEvent.seq)):
            usage.setdefault(run_id, []).append(data)
    ended, expect_recorded = 0, recorded
    for r in runs:
        recorded = (r.usage_input_tokens, r.usage_output_tokens, r.usage_cost_usd)
        if r.status not in TERMINAL or not expect_recorded:
            assert recorded == (None, None, None), r.id
            continue
        ended += 1
        datas = usage.get(r.id, [])
        costs = [d.get("cost_usd") for d in datas]
        assert recorded[:2] == (sum(d["input_tokens"] for d in datas),
                                sum(d["output_tokens"] for d in datas)), r.id
        if None in costs:
            assert recorded[2] is None, r.id
        else:
            assert recorded[2] is not None and abs(recorded[2] - sum(costs)) <= 1e-9, r.id
    return ended


def assert_rollup_matches_scan(db, *, usage_recorded: bool = True, minutes_from=None,
                               imported_since: datetime | None = None) -> int:
    """The rollups (per day, hour and minute) against a scan: exact counts, tokens and
    histograms; sums of floats to 1e-6; and every ended run's recorded usage totals against
    its events (``assert_usage_totals_match_events``). ``minutes_from``: as for ``scanned``.
    ``imported_since``: the runs were bulk imported by calls made since then, whose minute
    cut lies between the minutes kept then and now; the minutes between those two cuts are
    left out of the comparison. Returns the runs counted."""
    assert_usage_totals_match_events(db, recorded=usage_recorded)
    skipped: tuple = ()
    if imported_since is not None:
        earliest = minute_of(minutes_kept_from(imported_since))
        minutes_from = minutes_kept_from(datetime.now(UTC))
        skipped = (earliest, minute_of(minutes_from))
    counted = 0
    for by in ("minute", "hour", "day"):
        expected, got = scanned(db, by, minutes_from=minutes_from), stored(db, by)
        if by == "minute" and skipped:
            expected, got = ({k: v for k, v in rows.items() if not skipped[0] <= k[2] <= skipped[1]}
                             for rows in (expected, got))
        assert set(got) == set(expected), by
        for key, want in expected.items():
            have = got[key]
            for column, value in want.items():
                if isinstance(value, float):
                    assert abs(have[column] - value) <= 1e-6 * max(1.0, abs(value)), (by, key, column)
                else:
                    assert have[column] == value, (by, key, column, have[column], value)
        counted = sum(v["runs"] for v in expected.values())
    return counted
