"""queries.interrupted_runs: why runs were interrupted, what happened last, and the trend."""

from __future__ import annotations

from datetime import timedelta

import pytest
from support import history as h

from queries.common import TimeWindow
from queries.interrupted_runs import InterruptedFilters, interrupted_runs, interruption_trend

DAY = timedelta(days=1)
WINDOW = TimeWindow(h.at_seconds(0), h.at_seconds(0) + 2 * DAY)


@pytest.fixture
def ledger(db):
    h.agent(db, "planner")
    h.agent(db, "searcher")
    chats = [h.chat(db, owner="alice", agent_id="planner") for _ in range(6)]

    expired = h.ask(db, chats[0], "q", owner="alice", when=h.at_seconds(10))
    h.start(db, expired.run_id, h.at_seconds(11), "w-1", lease_seconds=30)  # lease until 41
    h.events(db, expired.run_id, h.at_seconds(15), [("message.delta", {"text": "half"})], "w-1")
    h.expire(db, expired.run_id, h.at_seconds(50))

    shutdown = h.ask(db, chats[1], "q", owner="alice", when=h.at_seconds(20))
    h.start(db, shutdown.run_id, h.at_seconds(21), "w-2")
    h.executor_gone(db, "w-2", h.at_seconds(25), "executor_shutdown")

    parent = h.ask(db, chats[2], "q", owner="alice", when=h.at_seconds(30))
    h.start(db, parent.run_id, h.at_seconds(31), "w-1")
    child = h.delegate(db, parent.run_id, "searcher", h.at_seconds(32), "w-1")
    h.fail(db, parent.run_id, h.at_seconds(33), "w-1")
    h.orphan_check(db, child, h.at_seconds(34))

    restart = h.ask(db, chats[3], "q", owner="alice", when=h.at_seconds(0) + DAY)
    h.start(db, restart.run_id, h.at_seconds(5) + DAY, "w-3")
    h.executor_gone(db, "w-3", h.at_seconds(60) + DAY, "service_restart")

    # Decoys: interrupted before the window; a succeeded and a failed run inside it.
    old = h.ask(db, chats[4], "q", owner="alice", when=h.at_seconds(0) - 2 * DAY)
    h.start(db, old.run_id, h.at_seconds(1) - 2 * DAY, "w-9")
    h.executor_gone(db, "w-9", h.at_seconds(2) - 2 * DAY, "service_restart")
    h.answered(db, chats[5], "q", "a", owner="alice", when=h.at_seconds(70))
    return {"expired": expired.run_id, "shutdown": shutdown.run_id, "parent": parent.run_id,
            "child": child, "restart": restart.run_id, "old": old.run_id}


def listing(db, **filters):
    with db.read() as s:
        return interrupted_runs(s, InterruptedFilters(window=filters.pop("window", WINDOW),
                                                      **filters), limit=filters.pop("limit", 50))


def test_every_interrupted_run_with_its_reason_newest_first(db, ledger):
    page = listing(db)
    assert [i["run_id"] for i in page.items] == [ledger[k] for k in ("restart", "expired", "child",
                                                                     "shutdown")]
    assert [i["reason"] for i in page.items] == ["service_restart", "lease_expired",
                                                 "parent_terminal", "executor_shutdown"]
    assert page.next_cursor is None


def test_lease_expired_run_shows_executor_lease_and_last_event(db, ledger):
    item = next(i for i in listing(db).items if i["run_id"] == ledger["expired"])
    assert item["executor_instance_id"] == "w-1"
    assert item["lease_expires_at"] == h.at_seconds(41).isoformat()
    assert item["interrupted_at"] == h.at_seconds(50).isoformat()
    assert item["interrupted_seq"] == 4
    assert item["last_event"] == {"seq": 3, "type": "message.delta",
                                  "created_at": h.at_seconds(15).isoformat()}
    assert item["parent_run_id"] is None and item["parent_status"] is None
    assert (item["agent_id"], item["agent_name"], item["agent_version"]) == ("planner", "Planner", 1)


def test_orphaned_child_names_its_parent(db, ledger):
    item = next(i for i in listing(db).items if i["run_id"] == ledger["child"])
    assert item["parent_run_id"] == ledger["parent"] and item["parent_status"] == "failed"
    assert item["root_run_id"] == ledger["parent"]
    assert item["executor_instance_id"] is None and item["started_at"] is None
    assert item["last_event"]["type"] == "run.queued"


@pytest.mark.parametrize("filters, expected", [
    ({"reason": "executor_shutdown"}, ["shutdown"]),
    ({"reason": "lease_expired"}, ["expired"]),
    ({"executor_instance_id": "w-1"}, ["expired"]),
    ({"agent_id": "searcher"}, ["child"]),
    ({"window": TimeWindow(h.at_seconds(0) + DAY, None)}, ["restart"]),
    ({"window": TimeWindow()}, ["restart", "expired", "child", "shutdown", "old"]),
    ({"reason": "nope"}, []),
])
def test_filters(db, ledger, filters, expected):
    assert [i["run_id"] for i in listing(db, **filters).items] == [ledger[k] for k in expected]


def test_pages(db, ledger):
    seen, cursor = [], None
    with db.read() as s:
        while True:
            page = interrupted_runs(s, InterruptedFilters(window=WINDOW), limit=3, cursor=cursor)
            seen += [i["run_id"] for i in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
    assert seen == [ledger[k] for k in ("restart", "expired", "child", "shutdown")]


def test_trend_per_day_by_reason(db, ledger):
    with db.read() as s:
        trend = interruption_trend(s, InterruptedFilters(window=WINDOW))
        lease_only = interruption_trend(s, InterruptedFilters(window=WINDOW, reason="lease_expired"))
    day0 = h.T0.replace(hour=0).isoformat()
    day1 = (h.T0.replace(hour=0) + DAY).isoformat()
    assert trend.rows == [
        {"bucket": day0, "reason": "executor_shutdown", "count": 1},
        {"bucket": day0, "reason": "lease_expired", "count": 1},
        {"bucket": day0, "reason": "parent_terminal", "count": 1},
        {"bucket": day1, "reason": "service_restart", "count": 1},
    ]
    assert trend.by_reason == {"executor_shutdown": 1, "lease_expired": 1, "parent_terminal": 1,
                               "service_restart": 1}
    assert not trend.truncated and trend.bucket_seconds == 86400
    assert lease_only.rows == [{"bucket": day0, "reason": "lease_expired", "count": 1}]


def test_trend_in_hour_buckets(db, ledger):
    with db.read() as s:
        trend = interruption_trend(s, InterruptedFilters(window=WINDOW), bucket_seconds=3600)
    assert {r["bucket"] for r in trend.rows} == {h.T0.isoformat(), (h.T0 + DAY).isoformat()}


@pytest.mark.parametrize("seconds", [1, 60, 3600, 6 * 3600, 86400])
def test_time_buckets_are_the_floor_of_the_epoch_seconds(db, seconds):
    """``read_sql.time_bucket`` (every trend's buckets) against integer arithmetic on the
    timestamp's microseconds: whole boundaries, a microsecond either side, and odd moments."""
    from datetime import UTC, datetime

    from sqlalchemy import DateTime, literal, select

    from agentledger.core.read_sql import time_bucket

    boundary = datetime(2026, 12, 3, 0, 0, tzinfo=UTC)
    moments = [boundary + timedelta(microseconds=d) for d in (-1, 0, 1)]
    moments += [boundary + timedelta(seconds=k * 7919.123457) for k in range(-40, 40)]
    moments += [datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC),  # past a 32-bit epoch
                boundary + timedelta(days=3, microseconds=-1)]
    with db.read() as s:
        for moment in moments:
            found = s.execute(select(time_bucket(s, literal(moment, DateTime(timezone=True)),
                                                 seconds))).scalar_one()
            micros = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
            assert found == micros // (seconds * 10**6) * seconds, (moment, seconds)
