"""queries.agent_outcomes: per agent and per version, counts and rates by terminal status,
latency percentiles, queue wait, tokens and cost, and the trend per day."""

from __future__ import annotations

from datetime import timedelta

import pytest
from support import history as h

from queries.agent_outcomes import agent_outcomes
from queries.common import TimeWindow
from queries.outcome_trend import outcome_trend

DAY = timedelta(days=1)
WINDOW = TimeWindow(h.at_seconds(0), h.at_seconds(0) + 2 * DAY)
approx = lambda value: pytest.approx(value, abs=0.01)  # noqa: E731
# Percentiles are estimated from the rollup's log-scale histogram buckets (each 26 % wider than
# the one before), so they are asserted within one bucket of the exact value; counts, rates,
# means, tokens and cost stay exact.
estimate = lambda value: pytest.approx(value, rel=0.26)  # noqa: E731


@pytest.fixture
def ledger(db):
    h.agent(db, "alpha")
    h.agent(db, "beta")
    chat = h.chat(db, owner="alice", agent_id="alpha")
    t = h.at_seconds
    # alpha v1: succeeded (wait 1, ran 2), succeeded (wait 2, ran 4), failed (wait 3, ran 6),
    # cancelled before it started.
    a1 = h.ask(db, chat, "q", owner="alice", when=t(0)).run_id
    h.start(db, a1, t(1))
    h.usage(db, a1, t(2), 100, 10, 0.01)
    h.complete(db, a1, t(3), "a")
    a2 = h.ask(db, chat, "q", owner="alice", when=t(10)).run_id
    h.start(db, a2, t(12))
    h.usage(db, a2, t(13), 200, 20, 0.02)
    h.usage(db, a2, t(14), 50, 5, 0.005)
    h.complete(db, a2, t(16), "a")
    a3 = h.ask(db, chat, "q", owner="alice", when=t(20)).run_id
    h.start(db, a3, t(23))
    h.fail(db, a3, t(29))
    a4 = h.ask(db, chat, "q", owner="alice", when=t(30)).run_id
    h.cancel(db, a4, t(31))
    h.new_version(db, "alpha", "Alpha Pro", model="m2", when=t(40))
    # alpha v2: succeeded (wait 1, ran 10), interrupted by a restart (wait 1, ran 9), and one
    # still running the next day (wait 2).
    b1 = h.ask(db, chat, "q", owner="alice", when=t(50)).run_id
    h.start(db, b1, t(51))
    h.usage(db, b1, t(52), 1000, 100, 0.1)
    h.complete(db, b1, t(61), "a")
    b2 = h.ask(db, chat, "q", owner="alice", when=t(70)).run_id
    h.start(db, b2, t(71), "w-restarted")
    h.executor_gone(db, "w-restarted", t(80), "service_restart")
    later = h.chat(db, owner="alice", agent_id="alpha")
    b3 = h.ask(db, later, "q", owner="alice", when=t(90) + DAY).run_id
    h.start(db, b3, t(92) + DAY)
    # beta v1: one quick success.
    h.answered(db, chat, "q", "a", owner="alice", when=t(100), agent_id="beta", queue_s=1, run_s=1)
    # Decoy: an alpha run from before the window (its 500 s latency would move the percentiles).
    old = h.answered(db, h.chat(db, owner="bob", agent_id="alpha"), "q", "a", owner="bob",
                     when=t(0) - 3 * DAY, run_s=500)
    return {"old": old.run_id}


def outcomes(db, **kwargs):
    with db.read() as s:
        return agent_outcomes(s, kwargs.pop("window", WINDOW), **kwargs)


def test_per_version_counts_rates_latency_wait_tokens_cost(db, ledger):
    found = outcomes(db)
    v1 = found.version("alpha", 1)
    assert (v1.name, v1.runs, v1.finished, v1.unfinished) == ("Alpha", 4, 4, 0)
    assert v1.by_status == {"succeeded": 2, "failed": 1, "cancelled": 1, "interrupted": 0,
                            "queued": 0, "running": 0, "cancelling": 0}
    assert v1.rates == {"succeeded": 0.5, "failed": 0.25, "cancelled": 0.25, "interrupted": 0.0}
    # latencies 2, 4, 6 s; queue waits 1, 2, 3 s (percentile_cont interpolation, estimated)
    assert (v1.latency_p50, v1.latency_p95, v1.latency_p99) == (estimate(4), estimate(5.8),
                                                                estimate(5.96))
    assert v1.latency_p99 <= 6  # never beyond the largest value seen
    assert v1.latency_mean == approx(4)
    assert (v1.queue_wait_p50, v1.queue_wait_p95, v1.queue_wait_mean) == (estimate(2),
                                                                           estimate(2.9), approx(2))
    assert (v1.input_tokens, v1.output_tokens, v1.cost_usd) == (350, 35, approx(0.035))

    v2 = found.version("alpha", 2)
    assert (v2.name, v2.runs, v2.finished, v2.unfinished) == ("Alpha Pro", 3, 2, 1)
    assert v2.by_status["interrupted"] == 1 and v2.by_status["running"] == 1
    assert v2.rates["succeeded"] == 0.5 and v2.rates["interrupted"] == 0.5
    assert (v2.latency_p50, v2.latency_mean) == (estimate(9.5), approx(9.5))  # 10 and 9 s
    assert (v2.queue_wait_p50, v2.queue_wait_mean) == (estimate(1), approx(4 / 3))  # 1, 1, 2 s
    assert (v2.input_tokens, v2.output_tokens, v2.cost_usd) == (1000, 100, approx(0.1))


def test_per_agent_totals_cover_all_versions(db, ledger):
    found = outcomes(db)
    assert [a.agent_id for a in found.agents] == ["alpha", "beta"]
    alpha, beta = found.agents
    assert (alpha.version, alpha.name, alpha.runs, alpha.finished) == (None, "Alpha Pro", 7, 6)
    # latencies 2, 4, 6, 9, 10 s
    assert (alpha.latency_p50, alpha.latency_p95, alpha.latency_p99) == (estimate(6),
                                                                         estimate(9.8),
                                                                         estimate(9.96))
    assert alpha.latency_mean == approx(6.2)
    assert (alpha.input_tokens, alpha.output_tokens, alpha.cost_usd) == (1350, 135, approx(0.135))
    assert alpha.rates["succeeded"] == approx(3 / 6)
    # one run: the estimate is clamped to the observed minimum and maximum, so it is exact
    assert (beta.runs, beta.latency_p50, beta.queue_wait_p50) == (1, approx(1), approx(1))
    assert (beta.input_tokens, beta.cost_usd) == (0, 0.0)
    assert not found.groups_truncated
    assert [(v.agent_id, v.version) for v in found.versions] == [("alpha", 1), ("alpha", 2),
                                                                  ("beta", 1)]
    assert found.versions_of("beta")[0].as_dict()["latency_p99"] == approx(1)


def test_one_agent_and_other_windows(db, ledger):
    only = outcomes(db, agent_id="beta")
    assert [a.agent_id for a in only.agents] == ["beta"] and len(only.versions) == 1
    everything = outcomes(db, window=TimeWindow())
    # The decoy (written after v2 was registered, so frozen on v2) counts only without a window.
    assert everything.agents[0].runs == 8 and everything.version("alpha", 2).runs == 4
    assert everything.version("alpha", 2).latency_p99 > 100
    empty = outcomes(db, window=TimeWindow(h.at_seconds(0) - 10 * DAY, h.at_seconds(0) - 9 * DAY))
    assert empty.agents == [] and empty.versions == []


def test_trend_per_day_by_status(db, ledger):
    day0 = h.T0.replace(hour=0).isoformat()
    day1 = (h.T0.replace(hour=0) + DAY).isoformat()
    with db.read() as s:
        alpha = outcome_trend(s, WINDOW, agent_id="alpha")
        v2 = outcome_trend(s, WINDOW, agent_id="alpha", version=2)
    assert alpha.rows == [
        {"bucket": day0, "status": "cancelled", "count": 1},
        {"bucket": day0, "status": "failed", "count": 1},
        {"bucket": day0, "status": "interrupted", "count": 1},
        {"bucket": day0, "status": "succeeded", "count": 3},
        {"bucket": day1, "status": "running", "count": 1},
    ]
    assert v2.rows == [
        {"bucket": day0, "status": "interrupted", "count": 1},
        {"bucket": day0, "status": "succeeded", "count": 1},
        {"bucket": day1, "status": "running", "count": 1},
    ]
    assert not alpha.truncated
