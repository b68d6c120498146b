"""The per-agent outcome rollup: maintained in the transaction that ends each run, equal to a
full scan of agent_run/run_event after any mix of lifecycles, and what agent_outcomes reads."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from support import history as h
from support.rollup import assert_rollup_matches_scan, stored

from agentledger.core.outcome_histogram import EDGES, bucket_of, estimate_percentiles
from agentledger.core.rollup_periods import MINUTE_ROLLUP_KEPT, minute_of
from agentledger.core.schema import (
    AgentOutcomeRollup,
    AgentOutcomeRollupHour,
    AgentOutcomeRollupMinute,
)
from ingest.rollup import ROLLUP_SHARDS, fold_shards, rebuild_rollup, rollup_shard
from queries.agent_outcomes import agent_outcomes
from queries.common import TimeWindow
from queries.outcome_trend import outcome_trend

DAY = timedelta(days=1)


def random_lifecycles(db, rng: random.Random, runs: int) -> None:
    """Every way a run can end, through the ingest functions, over three days."""
    h.agent(db, "alpha", names=("Alpha", "Alpha 2"))
    h.agent(db, "beta")
    t = h.T0
    for n in range(runs):
        t += timedelta(seconds=rng.uniform(60, 3 * 86400 / runs))
        agent = rng.choice(["alpha", "beta", None])
        owner = rng.choice(["alice", "bob"])
        chat = h.chat(db, owner=owner, agent_id="alpha")  # one thread each: no FIFO waits
        run = h.ask(db, chat, "q", owner=owner, when=t, agent_id=agent).run_id
        kind = rng.choice(["ok", "ok", "fail", "cancel_queued", "cancel_running", "expire",
                           "restart", "delegate", "usage_then_fail", "left_running"])
        at = t + timedelta(seconds=rng.uniform(0, 5))
        if kind == "cancel_queued":
            h.cancel(db, run, at)
            continue
        executor = f"w-{n}"
        h.start(db, run, at, executor)
        at += timedelta(seconds=rng.uniform(0.001, 20))
        if kind in ("ok", "usage_then_fail", "cancel_running", "delegate"):
            for _ in range(rng.randint(0, 2)):
                h.usage(db, run, at, rng.randint(1, 900), rng.randint(1, 90),
                        round(rng.uniform(0, 0.05), 6), executor)
        if kind == "ok":
            h.complete(db, run, at + timedelta(seconds=rng.uniform(0, 500)), "a", executor)
        elif kind in ("fail", "usage_then_fail"):
            h.fail(db, run, at, executor)
        elif kind == "cancel_running":
            h.cancel(db, run, at, confirm_at=at + timedelta(seconds=1), executor=executor)
        elif kind == "expire":
            h.expire(db, run, at + timedelta(seconds=h.LEASE + 1))
        elif kind == "restart":
            h.executor_gone(db, executor, at, "service_restart")
        elif kind == "delegate":
            child = h.delegate(db, run, "beta", at, executor)
            if rng.random() < 0.5:
                h.start(db, child, at + timedelta(seconds=1), "kid")
                h.usage(db, child, at + timedelta(seconds=2), 5, 5, 0.001, "kid")
                h.complete(db, child, at + timedelta(seconds=3), "c", "kid")
                h.complete(db, run, at + timedelta(seconds=4), "p", executor)
            else:
                h.fail(db, run, at + timedelta(seconds=1), executor)
                h.orphan_check(db, child, at + timedelta(seconds=2))
        # "left_running" stays running: not in the rollup, read live by the queries


def test_rollup_equals_full_scan_after_random_lifecycles(db):
    random_lifecycles(db, random.Random(7), 45)
    counted = assert_rollup_matches_scan(db)
    assert counted > 30
    statuses = {key[3] for key in stored(db)}
    assert statuses == {"succeeded", "failed", "cancelled", "interrupted"}
    # rebuilding from the tables gives the same rows; minutes only those kept at its "now"
    before, before_minutes = stored(db), stored(db, "minute")
    rebuilt_at = h.T0 + 3 * DAY
    with db.write() as s:
        assert rebuild_rollup(s, now=rebuilt_at) == counted
    assert set(stored(db)) == set(before)
    kept_from = rebuilt_at - MINUTE_ROLLUP_KEPT
    assert assert_rollup_matches_scan(db, minutes_from=kept_from) == counted
    minutes = stored(db, "minute")
    assert minutes and all(minute >= minute_of(kept_from) for _a, _v, minute, _s in minutes)
    assert len(minutes) < len(before_minutes)


def test_queries_answer_from_the_rollup_like_a_scan(db):
    random_lifecycles(db, random.Random(11), 30)
    day0 = h.T0.replace(hour=0)
    aligned = TimeWindow(day0, day0 + 4 * DAY)  # whole days: the rollup alone (plus live runs)
    unaligned = TimeWindow(h.T0 - timedelta(hours=3), h.T0 + 4 * DAY)  # edges scanned
    everything = TimeWindow()
    with db.read() as s:
        results = [agent_outcomes(s, w) for w in (aligned, unaligned, everything)]
        trends = [outcome_trend(s, w, agent_id="alpha") for w in (aligned, unaligned)]
        by_scan = outcome_trend(s, aligned, agent_id="alpha", bucket_seconds=43200)
    first = results[0]
    for other in results[1:]:
        assert [o.as_dict() for o in other.versions] == [o.as_dict() for o in first.versions]
        assert [o.as_dict() for o in other.agents] == [o.as_dict() for o in first.agents]
    assert trends[0].rows == trends[1].rows
    assert sum(r["count"] for r in trends[0].rows) == sum(r["count"] for r in by_scan.rows)
    assert sum(o.runs for o in first.agents) == _all_runs(db)
    running = sum(o.by_status["running"] for o in first.agents)
    assert running >= 1  # the live part counted runs that have not ended


def _all_runs(db) -> int:
    from agentledger.core.schema import AgentRun

    with db.read() as s:
        return len(s.execute(select(AgentRun.id)).all())


def test_run_endings_sum_into_the_shards_of_one_agent_version_day_status(db):
    h.agent(db, "alpha")
    chat = h.chat(db, owner="alice", agent_id="alpha")
    run_ids = [
        h.answered(db, chat, "q", "a", owner="alice", when=h.at_seconds(n * 10), queue_s=1,
                   run_s=2 + n).run_id
        for n in range(3)
    ]
    with db.read() as s:
        rows = s.execute(select(AgentOutcomeRollup.__table__)).mappings().all()
    # Each ending was one upsert into its run's shard, so the rows are exactly those shards.
    assert sorted(r["shard"] for r in rows) == sorted({rollup_shard(r) for r in run_ids})
    assert {(r["agent_id"], r["agent_version"], r["status"], r["day"]) for r in rows} == {
        ("alpha", 1, "succeeded", h.T0.date())}
    [row] = stored(db).values()  # the shards merged
    assert row["runs"] == 3
    assert (row["latency_n"], row["latency_sum"], row["latency_min"], row["latency_max"]) == (3, 9.0, 2.0, 4.0)
    assert (row["wait_n"], row["wait_sum"], row["wait_min"], row["wait_max"]) == (3, 3.0, 1.0, 1.0)
    assert row["latency_h"][bucket_of(3.0)] == 1 and row["wait_h"][bucket_of(1.0)] == 3


def test_rollup_shards_spread_run_ids_over_every_shard():
    from agentledger.core.ids import new_id

    counts = [0] * ROLLUP_SHARDS
    for _ in range(3200):
        counts[rollup_shard(new_id("run"))] += 1
    assert min(counts) > 100  # about 200 each: no shard is left out or overloaded


def test_histogram_buckets_and_estimates():
    assert bucket_of(0) == 0 and bucket_of(-1) == 0 and bucket_of(0.0099) == 0
    assert bucket_of(0.01) == 1 and bucket_of(10**9) == 63
    for i, edge in enumerate(EDGES):
        assert bucket_of(edge) == i + 1
    values = [random.Random(3).lognormvariate(1, 1.2) for _ in range(5000)]
    counts = [0] * 64
    for v in values:
        counts[bucket_of(v)] += 1
    ordered = sorted(values)
    p50, p95, p99 = estimate_percentiles(counts, (0.5, 0.95, 0.99), min(values), max(values))
    for estimate, exact in ((p50, ordered[2500]), (p95, ordered[4750]), (p99, ordered[4950])):
        assert abs(estimate - exact) / exact < 0.26
    assert estimate_percentiles([0] * 64, (0.5,), None, None) == [None]
    one = [0] * 64
    one[bucket_of(7.5)] = 1
    assert estimate_percentiles(one, (0.5, 0.99), 7.5, 7.5) == [7.5, 7.5]


def test_a_window_inside_one_day_and_an_empty_rollup(db):
    h.agent(db, "alpha")
    chat = h.chat(db, owner="alice", agent_id="alpha")
    h.answered(db, chat, "q", "a", owner="alice", when=h.at_seconds(0))
    with db.read() as s:
        inside = agent_outcomes(s, TimeWindow(h.T0 - timedelta(minutes=5), h.T0 + timedelta(hours=1)))
        before = agent_outcomes(s, TimeWindow(None, h.T0.replace(hour=0)))
        after = agent_outcomes(s, TimeWindow(datetime.now(UTC), None))
    assert inside.agents[0].runs == 1 and inside.agents[0].latency_p50 == pytest.approx(4)
    assert before.agents == [] and after.agents == []


@pytest.mark.parametrize("width", [3600, 6 * 3600, 7 * 86400])
def test_hour_wide_trend_buckets_from_the_hour_rollup_equal_a_scan(db, width):
    from queries.outcome_trend import _trend_by_scan

    random_lifecycles(db, random.Random(5), 30)
    windows = [
        TimeWindow(h.T0 - timedelta(minutes=50), h.T0 + 2 * DAY + timedelta(minutes=17)),
        TimeWindow(h.T0.replace(minute=0), h.T0 + 3 * DAY),
        TimeWindow(h.T0 + timedelta(minutes=5), h.T0 + timedelta(minutes=55)),  # inside an hour
        TimeWindow(h.T0 + DAY, None),
        TimeWindow(None, h.T0 + DAY + timedelta(minutes=30)),
    ]
    counted = 0
    with db.read() as s:
        for window in windows:
            for agent in (None, "alpha"):
                rolled = outcome_trend(s, window, agent_id=agent, bucket_seconds=width)
                scanned = _trend_by_scan(s, window, agent, None, width)
                assert rolled.rows == scanned.rows, (window, agent)
                assert rolled.bucket_seconds == width
                counted += sum(r["count"] for r in rolled.rows)
    assert counted > 30  # the windows hold runs: the comparison is not of empty lists


def test_postgresql_buckets_a_duration_where_bucket_of_does(pg_db):
    """The edge scan on PostgreSQL counts durations into buckets with width_bucket over the
    same edges: at, just below and just above every edge it agrees with bucket_of."""
    import math

    from sqlalchemy import cast, literal
    from sqlalchemy.dialects.postgresql import FLOAT

    from agentledger.core.read_sql import histogram_bucket_pg

    values = [-1.0, 0.0, 0.009999, 1e7, *EDGES, *(math.nextafter(e, 0) for e in EDGES),
              *(math.nextafter(e, math.inf) for e in EDGES)]
    with pg_db.read() as s:
        found = [s.execute(select(histogram_bucket_pg(cast(literal(v), FLOAT(precision=53)))))
                 .scalar_one() for v in values]
    assert found == [bucket_of(v) for v in values]


def test_postgresql_durations_are_the_seconds_python_computes(pg_db):
    """The scans' durations on PostgreSQL are exactly ``timedelta.total_seconds()``, under a
    day and from a day up (where the interval has a day part), negative ones too."""
    from sqlalchemy import column, values
    from sqlalchemy.types import DateTime

    from agentledger.core.read_sql import exact_seconds_pg

    rng = random.Random(11)
    base = datetime(2026, 3, 1, 12, tzinfo=UTC)
    pairs = []
    for scale in (60.0, 86_400.0, 40 * 86_400.0):
        for _ in range(700):
            span = timedelta(microseconds=int(rng.uniform(-scale, scale) * 1e6))
            pairs.append((base, base + span))
    pairs += [(base, base + timedelta(days=d, microseconds=u))
              for d in (-1, 0, 1) for u in (-1, 0, 1)]
    table = values(column("a", DateTime(timezone=True)), column("b", DateTime(timezone=True)),
                   name="pairs").data(pairs)
    with pg_db.read() as s:
        found = s.execute(select(table.c.a, table.c.b,
                                 exact_seconds_pg(table.c.b, table.c.a))).all()
    assert len(found) == len(pairs)
    wrong = [(a, b, got) for a, b, got in found if got != (b - a).total_seconds()]
    assert not wrong, wrong[:5]


def test_postgresql_sums_an_edge_as_python_does_run_by_run(pg_db):
    """The same runs summed by the database and run by run in Python: equal counts, buckets,
    extremes, tokens and unpriced runs; equal sums up to float rounding."""
    from sqlalchemy import update

    from agentledger.core.schema import AgentRun
    from queries.outcome_windows import run_conditions

    db = pg_db
    random_lifecycles(db, random.Random(5), 40)
    chat = h.chat(db, owner="carol", agent_id="alpha")
    unpriced = h.ask(db, chat, "q", owner="carol", when=h.T0 + timedelta(hours=7)).run_id
    # queued for more than a day: PostgreSQL's interval then has a day part
    started = h.T0 + timedelta(days=1, hours=9, microseconds=7)
    h.start(db, unpriced, started, "w-x")
    h.usage(db, unpriced, started + timedelta(seconds=1), 10, 2, None, "w-x")
    h.usage(db, unpriced, started + timedelta(seconds=2), 5, 1, 0.25, "w-x")
    h.complete(db, unpriced, started + timedelta(seconds=3, microseconds=3), "a", "w-x")
    windows = [TimeWindow(h.T0 - DAY, h.T0 + 5 * DAY),
               TimeWindow(h.T0 + timedelta(hours=5, minutes=17), h.T0 + timedelta(days=2, hours=3))]
    # with every ended run's usage totals on its row, then with half of them summed from
    # their events (runs that ended before the totals were recorded)
    for recorded in ("all", "half"):
        if recorded == "half":
            with db.write() as s:
                ids = sorted(s.execute(select(AgentRun.id)
                                       .where(AgentRun.usage_input_tokens.is_not(None)))
                             .scalars())
                s.execute(update(AgentRun).where(AgentRun.id.in_(ids[::2]))
                          .values(usage_input_tokens=None, usage_output_tokens=None,
                                  usage_cost_usd=None))
        for window in windows:
            _assert_scans_agree(db, run_conditions(window, None))


def _assert_scans_agree(db, where: list) -> None:
    from queries.agent_outcomes import (
        _scan_in_database,
        _scan_run_by_run,
        summed_runs,
        unrecorded_usage,
    )

    by_python: dict = {}
    by_database: dict = {}
    with db.read() as s:
        _scan_run_by_run(s, where, {}, by_python)
        _scan_in_database(s, (summed_runs(where), unrecorded_usage(where)), {}, by_database)
    assert set(by_python) == set(by_database) and by_python
    for key, expected in by_python.items():
        got = by_database[key]
        assert (got.runs, got.by_status, got.input_tokens, got.output_tokens,
                got.runs_without_cost) == (expected.runs, expected.by_status,
                                           expected.input_tokens, expected.output_tokens,
                                           expected.runs_without_cost), key
        assert got.cost_usd == pytest.approx(expected.cost_usd, rel=1e-12, abs=1e-12)
        for mine, theirs in ((got.latency, expected.latency), (got.wait, expected.wait)):
            assert (mine.n, mine.min, mine.max, mine.histogram) == (
                theirs.n, theirs.min, theirs.max, theirs.histogram), key
            assert mine.total == pytest.approx(theirs.total, rel=1e-12)
    assert any(acc.runs_without_cost for acc in by_python.values())


def test_outcomes_read_the_same_with_or_without_recorded_usage_totals(db):
    """Runs that ended before ``agent_run.usage_*`` existed have none recorded (NULL): the
    scans sum their events instead, so every answer is the same."""
    from sqlalchemy import update

    from agentledger.core.schema import AgentRun

    random_lifecycles(db, random.Random(13), 40)
    chat = h.chat(db, owner="carol", agent_id="alpha")
    unpriced = h.ask(db, chat, "q", owner="carol", when=h.T0 + timedelta(hours=7)).run_id
    h.start(db, unpriced, h.T0 + timedelta(hours=8), "w-x")
    h.usage(db, unpriced, h.T0 + timedelta(hours=8, seconds=1), 10, 2, None, "w-x")
    h.complete(db, unpriced, h.T0 + timedelta(hours=8, seconds=2), "a", "w-x")
    windows = [TimeWindow(h.T0 - timedelta(minutes=23), h.T0 + timedelta(days=2, minutes=41)),
               TimeWindow(h.T0 + timedelta(hours=5, minutes=17), h.T0 + timedelta(hours=9)),
               TimeWindow()]

    def answers():
        with db.read() as s:
            found = [agent_outcomes(s, w).as_dict() for w in windows]
        return found

    recorded = answers()
    assert any(v["runs_without_cost"] for a in recorded for v in a["versions"])
    assert any(v["input_tokens"] for a in recorded for v in a["versions"])
    with db.write() as s:  # as after the upgrade: half of the ended runs without totals
        ids = sorted(s.execute(select(AgentRun.id).where(AgentRun.usage_input_tokens.is_not(None)))
                     .scalars())
        assert len(ids) > 20
        s.execute(update(AgentRun).where(AgentRun.id.in_(ids[::2]))
                  .values(usage_input_tokens=None, usage_output_tokens=None, usage_cost_usd=None))
    assert _approx(answers()) == _approx(recorded)
    with db.write() as s:
        s.execute(update(AgentRun).values(usage_input_tokens=None, usage_output_tokens=None,
                                          usage_cost_usd=None))
    assert _approx(answers()) == _approx(recorded)


def _approx(answers: list[dict]) -> list[dict]:
    """Float sums rounded: the database and Python may add in another order."""
    def rounded(value):
        if isinstance(value, float):
            return round(value, 9)
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value
    return rounded(answers)


def _shard_rows(db) -> dict[str, list[tuple]]:
    """Per table, (period, shard) of every stored row."""
    found = {}
    with db.read() as s:
        for model, period in ((AgentOutcomeRollup, "day"), (AgentOutcomeRollupHour, "hour"),
                              (AgentOutcomeRollupMinute, "minute")):
            table = model.__table__
            found[period] = [(r[period], r["shard"])
                             for r in s.execute(select(table)).mappings()]
    return found


def _unfolded(db) -> int:
    return sum(1 for rows in _shard_rows(db).values() for _period, shard in rows if shard)


def test_folding_shards_keeps_every_sum_and_every_answer(db):
    random_lifecycles(db, random.Random(17), 60)
    windows = [TimeWindow(h.T0 - timedelta(minutes=23), h.T0 + timedelta(days=2, minutes=41)),
               TimeWindow(h.T0 + timedelta(hours=5, minutes=17), h.T0 + timedelta(hours=9)),
               TimeWindow(h.T0 + timedelta(days=1)), TimeWindow()]

    def answers():
        with db.read() as s:
            return [agent_outcomes(s, w).as_dict() for w in windows]

    before, keys = answers(), {by: set(stored(db, by)) for by in ("day", "hour", "minute")}
    unfolded = _unfolded(db)
    assert unfolded > 20

    middle = h.T0 + timedelta(days=1, hours=5, minutes=30)
    with db.write() as s:
        folded = fold_shards(s, settled_before=middle)
    assert 0 < folded < unfolded
    assert _unfolded(db) == unfolded - folded
    bounds = {"day": middle.date(), "hour": middle.replace(minute=0), "minute": middle}
    for by, rows in _shard_rows(db).items():
        # what was over by then is one shard-0 row per key; the rest is as it was
        assert all(shard == 0 for period, shard in rows if period < bounds[by]), by
        assert any(shard for period, shard in rows if period >= bounds[by]), by
        assert len({p for p, _ in rows if p < bounds[by]}) > 0
    assert_rollup_matches_scan(db)
    assert _approx(answers()) == _approx(before)

    with db.write() as s:
        assert fold_shards(s, settled_before=datetime.now(UTC) + DAY) == unfolded - folded
    assert _unfolded(db) == 0
    for by in ("day", "hour", "minute"):
        assert set(stored(db, by)) == keys[by]
        assert len(_shard_rows(db)[by]) == len(keys[by])  # one row per key
    assert_rollup_matches_scan(db)
    assert _approx(answers()) == _approx(before)
    with db.write() as s:
        assert fold_shards(s, settled_before=datetime.now(UTC) + DAY) == 0


def test_a_run_ending_after_its_hour_was_folded_is_counted_and_folded_later(db):
    h.agent(db, "alpha")
    chat = h.chat(db, owner="alice", agent_id="alpha")
    for n in range(40):
        h.answered(db, chat, "q", "a", owner="alice", when=h.at_seconds(n * 30))
    late = h.ask(db, h.chat(db, owner="bob", agent_id="alpha"), "q", owner="bob",
                 when=h.at_seconds(600)).run_id
    h.start(db, late, h.at_seconds(601), "w-late")
    with db.write() as s:
        assert fold_shards(s, settled_before=h.T0 + 3 * DAY) > 0
    assert _unfolded(db) == 0
    # its day and hour were folded (as if over): the ending adds a fresh shard row
    h.complete(db, late, h.at_seconds(900), "late answer", "w-late")
    assert_rollup_matches_scan(db)
    with db.write() as s:
        assert fold_shards(s, settled_before=h.T0 + 3 * DAY) == (
            3 if rollup_shard(late) else 0)  # its day, hour and minute rows, unless shard 0
    assert_rollup_matches_scan(db)
    with db.read() as s:
        [version] = agent_outcomes(s, TimeWindow()).versions
    assert version.runs == 41 and version.by_status["succeeded"] == 41


@pytest.mark.pg_only
def test_folding_while_runs_end_concurrently_loses_and_doubles_nothing(pg_db):
    """Run endings upsert the shard rows a fold deletes, at the same time: every ending is
    counted once, whichever waits for whom (and no ending fails on a deadlock)."""
    import threading

    db = pg_db
    h.agent(db, "alpha")
    now = datetime.now(UTC)
    errors: list[BaseException] = []
    done = threading.Event()
    folded = []

    def end_runs(worker: int) -> None:
        try:
            chat = h.chat(db, owner=f"owner-{worker}", agent_id="alpha")
            for n in range(25):
                h.answered(db, chat, "q", "a", owner=f"owner-{worker}",
                           when=now - timedelta(minutes=90) + timedelta(seconds=n),
                           executor=f"w-{worker}")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def fold() -> None:
        try:
            while not done.is_set():
                with db.write() as s:
                    folded.append(fold_shards(s, settled_before=now + DAY))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    writers = [threading.Thread(target=end_runs, args=(w,)) for w in range(6)]
    folders = [threading.Thread(target=fold) for _ in range(2)]
    for t in folders + writers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    for t in folders:
        t.join()
    assert errors == []
    assert sum(folded) > 0  # the folds ran while the endings came in
    assert assert_rollup_matches_scan(db) == 150
    with db.write() as s:
        fold_shards(s, settled_before=now + DAY)
    assert _unfolded(db) == 0
    assert assert_rollup_matches_scan(db) == 150


def test_folding_in_small_steps_folds_the_oldest_first_and_ends_the_same(db):
    random_lifecycles(db, random.Random(19), 40)
    unfolded = _unfolded(db)
    later = datetime.now(UTC) + DAY
    unfolded_hours = sorted(p for p, shard in _shard_rows(db)["hour"] if shard)
    with db.write() as s:
        assert fold_shards(s, settled_before=later, limit=3) == 9  # three rows of each table
    left_hours = sorted(p for p, shard in _shard_rows(db)["hour"] if shard)
    assert left_hours == unfolded_hours[3:]  # the three oldest went (ties: any of them)
    assert min(left_hours) >= max(unfolded_hours[:3])
    steps = 1
    while True:
        with db.write() as s:
            step = fold_shards(s, settled_before=later, limit=3)
        steps += 1
        if step < 3:
            break
    assert steps > 5 and _unfolded(db) == 0 and unfolded > 6
    assert_rollup_matches_scan(db)


def test_a_window_is_planned_as_days_hours_kept_minutes_and_two_partial_minutes_at_most():
    from queries.outcome_windows import split_window

    at = datetime(2026, 11, 4, 9, 37, 20, tzinfo=UTC)
    hour_long = TimeWindow(at, at + timedelta(hours=1))  # 09:37:20 to 10:37:20
    # without the minute rollup: the whole window is two partial hours, scanned
    assert split_window(hour_long).edges == (hour_long,)
    kept = split_window(hour_long, minutes_from=at - DAY)
    assert kept.hours == () and kept.minutes == (
        (at.replace(minute=38, second=0), at.replace(hour=10, minute=37, second=0)),)
    assert kept.edges == (TimeWindow(at, at.replace(minute=38, second=0)),
                          TimeWindow(at.replace(hour=10, minute=37, second=0), hour_long.end))
    # to the end: whole hours to midnight and beyond, the partial minute at the start
    to_now = split_window(TimeWindow(at, None), minutes_from=at)
    assert to_now.hours == ((at.replace(hour=10, minute=0, second=0),
                             at.replace(hour=0, minute=0, second=0) + DAY),)
    assert to_now.minutes == ((at.replace(minute=38, second=0), at.replace(hour=10, minute=0, second=0)),)
    assert to_now.edges == (TimeWindow(at, at.replace(minute=38, second=0)),)
    # a window starting before the minutes kept scans its first partial hour; its last
    # partial hour, within them, is read by minute
    long = TimeWindow(at - 3 * DAY, at)
    split = split_window(long, minutes_from=at - DAY)
    assert split.edges == (TimeWindow(long.start, at.replace(minute=0, second=0) - 3 * DAY + timedelta(hours=1)),
                           TimeWindow(at.replace(second=0), at))
    assert split.minutes == ((at.replace(minute=0, second=0), at.replace(second=0)),)
    # whole minutes everywhere: nothing scanned
    whole = split_window(TimeWindow(at.replace(second=0), at.replace(second=0) + timedelta(minutes=7)),
                         minutes_from=at - DAY)
    assert whole.edges == () and len(whole.minutes) == 1


def test_windows_within_the_kept_minutes_read_the_minute_rollup_and_answer_as_scanned(db):
    random_lifecycles(db, random.Random(23), 50)
    starts = [h.T0 + timedelta(hours=5, minutes=17, seconds=23),
              h.T0 + timedelta(days=1, minutes=41, seconds=7), h.T0 - timedelta(seconds=50)]
    windows = [TimeWindow(starts[0], starts[1]), TimeWindow(starts[0], None),
               TimeWindow(starts[2], starts[0]), TimeWindow(starts[1], starts[1] + timedelta(hours=1))]
    reading_at = h.T0 + DAY  # the minute rollup is read for every window above
    scanning_at = h.T0 + 30 * DAY  # it is read for none: partial hours are scanned

    def answers(now):
        with db.read() as s:
            return _approx([agent_outcomes(s, w, now=now).as_dict() for w in windows])

    # a run in the last partial hour of the first window (read by minute there, by hour in
    # the second one, which goes on)
    marked = starts[1] - timedelta(minutes=10)
    h.answered(db, h.chat(db, owner="carol", agent_id="alpha"), "q", "a", owner="carol",
               when=marked)
    by_minute = answers(reading_at)
    assert by_minute == answers(scanning_at)
    assert sum(a["runs"] for w in by_minute for a in w["agents"]) > 40

    # the minute rows are what the first answers read: the marked run's row inflated by
    # 1,000 runs shows in them, only in the window that reads its minute, and not in the
    # scanned answers
    table = AgentOutcomeRollupMinute.__table__
    with db.write() as s:
        changed = s.execute(table.update().where(table.c.minute == minute_of(marked))
                            .values(runs=table.c.runs + 1000))
        assert changed.rowcount == 1
    inflated = answers(reading_at)
    assert _runs(inflated[0]) == _runs(by_minute[0]) + 1000
    assert [_runs(a) for a in inflated[1:]] == [_runs(a) for a in by_minute[1:]]
    assert answers(scanning_at) == by_minute


def _runs(answer: dict) -> int:
    return sum(a["runs"] for a in answer["agents"])


def _rollup_rows(db, agent_id: str) -> dict:
    """Every rollup row of ``agent_id``, per table, keyed without the agent."""
    found = {}
    with db.read() as s:
        for model in (AgentOutcomeRollup, AgentOutcomeRollupHour, AgentOutcomeRollupMinute):
            table = model.__table__
            for row in s.execute(select(table).where(table.c.agent_id == agent_id)).mappings():
                values = dict(row)
                del values["agent_id"]
                found[(table.name, *(values.pop(c) for c in ("agent_version", "status", "shard")),
                       str(values.pop(next(c for c in ("day", "hour", "minute") if c in values))))] = values
    return found


def test_a_single_run_end_adds_what_a_batch_of_that_run_adds(db):
    """``record_run_end`` (one row per table naming the histogram bucket) and a ``RollupBatch``
    of the same run (every column written out) leave the same rows: new rows and rows added
    to, started and never started runs, unknown costs, the last bucket, and a run created
    before the kept minutes (no minute row)."""
    from agentledger.core.rollup_periods import minutes_kept_from
    from ingest.rollup import RollupBatch, RunOutcome, record_run_end

    now = minute_of(datetime.now(UTC)) + timedelta(seconds=30)
    outcomes = [
        RunOutcome("single", 1, "succeeded", now - timedelta(seconds=9), now - timedelta(seconds=8),
                   now, 120, 30, 0.002),
        RunOutcome("single", 1, "succeeded", now - timedelta(seconds=65),
                   now - timedelta(seconds=64.5), now, 7, 3, None),
        RunOutcome("single", 1, "cancelled", now - timedelta(seconds=3), None, now),
        RunOutcome("single", 2, "failed", now - timedelta(hours=9), now - timedelta(hours=8.9),
                   now, 1, 1, 0.5),
        RunOutcome("single", 2, "failed", now - 3 * DAY, now - 3 * DAY + timedelta(seconds=0.001),
                   now, 0, 0, 0.0),
    ]
    for outcome in outcomes + outcomes[:2]:  # the last two add to rows that exist
        with db.write() as s:
            record_run_end(s, outcome, shard=3)
        with db.write() as s:
            batch = RollupBatch(minutes_from=minutes_kept_from(outcome.finished_at))
            batch.add(RunOutcome("batch", *[getattr(outcome, f) for f in (
                "agent_version", "status", "created_at", "started_at", "finished_at",
                "input_tokens", "output_tokens", "cost_usd")]), shard=3)
            batch.write(s)
    single, batched = _rollup_rows(db, "single"), _rollup_rows(db, "batch")
    assert single == batched
    assert sum(1 for key in single if key[0] == "agent_outcome_rollup_minute") == 4
    assert sum(row["runs"] for key, row in single.items() if key[0] == "agent_outcome_rollup") == 7
    failed_hours = [row for key, row in single.items()
                    if key[0] == "agent_outcome_rollup_hour" and key[1:3] == (2, "failed")]
    assert sorted((row["latency_h63"], row["wait_h00"]) for row in failed_hours) == [(1, 0), (1, 1)]


@pytest.mark.pg_only
def test_a_run_end_locks_its_rollup_rows_coarsest_first(pg_db):
    """One statement writes a run end's three rollup rows on PostgreSQL, and still takes their
    locks day, hour, minute (the order imports and other endings use): while another
    transaction holds the hour row, the ending holds the day row and has not touched the
    minute row."""
    import threading

    import psycopg
    from sqlalchemy.engine import make_url

    from ingest.rollup import RunOutcome, record_run_end

    db = pg_db
    now = datetime.now(UTC)
    outcome = RunOutcome("locks", 1, "succeeded", now - timedelta(seconds=2),
                         now - timedelta(seconds=1), now)
    with db.write() as s:
        record_run_end(s, outcome, shard=5)  # the three rows exist
    url = make_url(db.url)
    dsn = f"host={url.host} port={url.port or 5432} user={url.username} dbname={url.database}"
    where = "agent_id = 'locks' AND shard = 5"
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn) as probe:
        holder.execute(f"SELECT 1 FROM agent_outcome_rollup_hour WHERE {where} FOR UPDATE")
        errors: list[BaseException] = []

        def end() -> None:
            try:
                with db.write() as s:
                    record_run_end(s, outcome, shard=5)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        ending = threading.Thread(target=end)
        ending.start()

        def locked(table: str) -> bool:
            try:
                probe.execute(f"SELECT 1 FROM {table} WHERE {where} FOR UPDATE NOWAIT")
                return False
            except psycopg.errors.LockNotAvailable:
                return True
            finally:
                probe.rollback()

        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while not locked("agent_outcome_rollup") and datetime.now(UTC) < deadline:
            pass
        assert locked("agent_outcome_rollup")
        assert not locked("agent_outcome_rollup_minute")
        holder.rollback()  # the ending goes on
        ending.join(10)
        assert not ending.is_alive() and errors == []
    with db.read() as s:
        runs = [s.execute(select(t.runs).where(t.agent_id == "locks")).scalar_one()
                for t in (AgentOutcomeRollup, AgentOutcomeRollupHour, AgentOutcomeRollupMinute)]
    assert runs == [2, 2, 2]


@pytest.mark.pg_only
def test_one_statement_refuses_rows_that_give_a_shared_value_twice(pg_db):
    """The tables' upserts share their parameters by name in one statement: rows that disagree
    on a shared column are refused before anything is sent, not written with one of them."""
    from agentledger.core import dialect
    from ingest.rollup import _GREATEST, _LEAST, _ONE_HOT, TABLES

    now = datetime.now(UTC)
    common = {"agent_version": 1, "status": "succeeded", "shard": 0, "latency_n": 0,
              "latency_sum": 0.0, "wait_n": 0, "wait_sum": 0.0, "input_tokens": 0,
              "output_tokens": 0, "cost_usd": 0.0, "runs_without_cost": 0, "latency_min": None,
              "latency_max": None, "wait_min": None, "wait_max": None, "latency_bucket": None,
              "wait_bucket": None}
    (day, day_key), (hour, hour_key) = TABLES[0], TABLES[1]
    parts = [(day, day_key, {"agent_id": "twice", "day": now.date(), "runs": 1, **common}),
             (hour, hour_key, {"agent_id": "twice", "hour": now.replace(minute=0, second=0,
                                                                      microsecond=0),
                                "runs": 2, **common})]
    with pg_db.write() as s, pytest.raises(ValueError, match="runs"):
        dialect.upsert_adding_one(s, parts, one_hot=_ONE_HOT, least=_LEAST, greatest=_GREATEST)
    with pg_db.read() as s:
        assert s.execute(select(AgentOutcomeRollup.runs)
                         .where(AgentOutcomeRollup.agent_id == "twice")).all() == []
