"""queries.overview: runs by status over time, unfinished runs, recent interruptions, leases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from support import history as h

from queries.common import TimeWindow
from queries.overview import bucket_seconds_for, overview

NOW = datetime(2026, 5, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize("span, width", [
    (timedelta(hours=1), 300),
    (timedelta(hours=12), 300),
    (timedelta(hours=24), 900),
    (timedelta(days=7), 3600),
    (timedelta(days=30), 6 * 3600),
    (timedelta(days=90), 86400),
    (timedelta(days=400), 7 * 86400),
])
def test_bucket_width_gives_a_readable_number_of_bars(span, width):
    assert bucket_seconds_for(TimeWindow(NOW - span, None), NOW) == width
    assert bucket_seconds_for(TimeWindow(NOW - span, NOW), NOW) == width


def test_open_window_is_read_as_the_last_30_days():
    assert bucket_seconds_for(TimeWindow(), NOW) == 6 * 3600


@pytest.fixture
def ledger(db):
    h.agent(db, "bot")
    chats = [h.chat(db, owner="alice", agent_id="bot") for _ in range(5)]
    t = h.at_seconds
    done = [h.answered(db, chats[0], "q", "a", owner="alice", when=t(s)).run_id for s in (0, 30)]
    cut = h.ask(db, chats[1], "q", owner="alice", when=t(4000)).run_id
    h.start(db, cut, t(4001), "w-1")
    h.executor_gone(db, "w-1", t(4010), "executor_shutdown")
    now = datetime.now(UTC)
    running = h.ask(db, chats[2], "q", owner="alice", when=now - timedelta(seconds=5)).run_id
    h.start(db, running, now - timedelta(seconds=4), "w-live", lease_seconds=120)
    queued = h.ask(db, chats[3], "q", owner="alice", when=now - timedelta(seconds=3)).run_id
    # Decoy: a run before the window.
    h.answered(db, chats[4], "q", "a", owner="alice", when=t(-86400 * 3))
    return {"done": done, "cut": cut, "running": running, "queued": queued}


def test_overview(db, ledger):
    with db.read() as s:
        found = overview(s, TimeWindow(h.at_seconds(0), None))
    assert found.totals == {"succeeded": 2, "interrupted": 1, "running": 1, "queued": 1}
    assert found.bucket_seconds == 6 * 3600  # the window is 30 days long
    day_bucket = h.T0.replace(hour=6).isoformat()  # 09:00 falls in the 06:00-12:00 bucket
    assert {"bucket": day_bucket, "status": "succeeded", "count": 2} in found.status_buckets
    assert not found.buckets_truncated
    assert [r["run_id"] for r in found.unfinished_runs] == [ledger["queued"], ledger["running"]]
    assert found.unfinished_runs[1]["executor_instance_id"] == "w-live"
    assert not found.unfinished_truncated
    assert [r["run_id"] for r in found.recent_interruptions] == [ledger["cut"]]
    assert found.recent_interruptions[0]["reason"] == "executor_shutdown"
    assert found.leases["live_leases"] == 1 and found.leases["queued"] == 1
    assert found.leases["executors"] == 1


def test_overview_bounds_the_unfinished_list(db, ledger):
    with db.read() as s:
        found = overview(s, TimeWindow(h.at_seconds(0), None), unfinished_limit=1)
    assert [r["run_id"] for r in found.unfinished_runs] == [ledger["queued"]]
    assert found.unfinished_truncated
