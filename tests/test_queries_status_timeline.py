"""queries.status_timeline: queued → running → terminal phases per run, for a window and filters."""

from __future__ import annotations

from datetime import timedelta

import pytest
from support import history as h

from queries.common import TimeWindow
from queries.status_timeline import TimelineFilters, status_timeline

WINDOW = TimeWindow(h.at_seconds(0), h.at_seconds(3600))


@pytest.fixture
def ledger(db):
    h.agent(db, "planner")
    h.agent(db, "worker-bot")
    chats = [h.chat(db, owner=owner, agent_id="planner") for owner in ("alice", "alice", "bob", "alice")]
    done = h.answered(db, chats[0], "q", "a", owner="alice", when=h.at_seconds(10), queue_s=2,
                      run_s=8)
    never = h.ask(db, chats[1], "q", owner="alice", when=h.at_seconds(30))
    h.cancel(db, never.run_id, h.at_seconds(35))
    running = h.ask(db, chats[2], "q", owner="bob", when=h.at_seconds(40))
    h.start(db, running.run_id, h.at_seconds(41))
    child = h.delegate(db, running.run_id, "worker-bot", h.at_seconds(45))
    # Decoys: created before the window, and after it.
    h.answered(db, chats[3], "q", "a", owner="alice", when=h.at_seconds(-100))
    h.answered(db, chats[3], "q", "a", owner="alice", when=h.at_seconds(4000))
    return {"done": done.run_id, "never": never.run_id, "running": running.run_id, "child": child}


def timeline(db, filters=None, window=WINDOW, limit=300):
    with db.read() as s:
        return status_timeline(s, window, filters or TimelineFilters(), limit=limit)


def test_phases_of_each_run_in_the_window(db, ledger):
    found = timeline(db)
    assert found.total == 4 and not found.truncated
    rows = {r["run_id"]: r for r in found.rows}
    assert [r["run_id"] for r in found.rows] == [ledger[k] for k in ("done", "never", "running", "child")]

    done = rows[ledger["done"]]
    assert (done["status"], done["queued_seconds"], done["running_seconds"]) == ("succeeded", 2, 8)
    assert done["created_at"] == h.at_seconds(10).isoformat()
    assert done["queued_until"] == done["started_at"] == h.at_seconds(12).isoformat()
    assert done["running_until"] == done["finished_at"] == h.at_seconds(20).isoformat()
    assert (done["agent_id"], done["agent_name"], done["agent_version"]) == ("planner", "Planner", 1)

    never = rows[ledger["never"]]
    assert never["status"] == "cancelled" and never["started_at"] is None
    assert never["queued_seconds"] == 5 and never["running_seconds"] is None
    assert never["queued_until"] == h.at_seconds(35).isoformat() and never["running_until"] is None


def test_unfinished_phases_run_until_the_database_clock(db, ledger):
    found = timeline(db)
    rows = {r["run_id"]: r for r in found.rows}
    running = rows[ledger["running"]]
    assert running["status"] == "running" and running["finished_at"] is None
    assert running["running_until"] == found.now.isoformat()
    assert running["running_seconds"] == pytest.approx(
        (found.now - h.at_seconds(41)).total_seconds(), abs=0.01)
    child = rows[ledger["child"]]
    assert child["status"] == "queued" and child["queued_until"] == found.now.isoformat()
    assert child["parent_run_id"] == ledger["running"] and child["root_run_id"] == ledger["running"]


@pytest.mark.parametrize("filters, expected", [
    (TimelineFilters(status="cancelled"), ["never"]),
    (TimelineFilters(agent_id="worker-bot"), ["child"]),
    (TimelineFilters(owner_id="bob"), ["running", "child"]),
    (TimelineFilters(roots_only=True), ["done", "never", "running"]),
    (TimelineFilters(root_run_id="x"), []),
])
def test_filters(db, ledger, filters, expected):
    assert [r["run_id"] for r in timeline(db, filters).rows] == [ledger[k] for k in expected]


def test_a_limited_timeline_keeps_the_most_recent_runs_oldest_first(db, ledger):
    found = timeline(db, limit=2)
    assert found.total == 4 and found.truncated
    assert [r["run_id"] for r in found.rows] == [ledger["running"], ledger["child"]]


def test_open_windows(db, ledger):
    assert timeline(db, window=TimeWindow()).total == 6
    assert timeline(db, window=TimeWindow(None, h.at_seconds(0) - timedelta(microseconds=1))).total == 1
