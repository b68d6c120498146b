"""The dashboards' pure parts: figure builders (plain data in, figures out), URL parameters and
the keyset pager. No database, no browser."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dashboards import components, figures, params
from queries.common import TimeWindow

NOW = datetime(2026, 5, 1, 12, tzinfo=UTC)


def row(run_id, status, created, started=None, finished=None, parent=None):
    def at(seconds):
        return None if seconds is None else (NOW + timedelta(seconds=seconds)).isoformat()

    queued_until = at(started if started is not None else finished)
    return {
        "run_id": run_id, "root_run_id": "run_root", "parent_run_id": parent, "agent_id": "bot",
        "agent_name": "Bot", "agent_version": 1, "owner_id": "alice", "status": status,
        "created_at": at(created), "started_at": at(started), "finished_at": at(finished),
        "queued_until": queued_until, "running_until": at(finished) if started is not None else None,
        "queued_seconds": ((started if started is not None else finished) or 0) - created,
        "running_seconds": None if started is None else finished - started,
    }


def test_timeline_has_a_queued_phase_then_a_running_phase_per_outcome():
    rows = [row("run_a", "succeeded", 0, 2, 10), row("run_b", "failed", 5, 6, 7),
            row("run_c", "cancelled", 8, None, 9)]
    fig = figures.timeline(rows)
    traces = {t.name: t for t in fig.data}
    assert set(traces) == {"queued", "ran → succeeded", "ran → failed", "cancelled before start"}
    assert list(traces["queued"].x) == [2, 1, 1] and list(traces["queued"].base) == [0, 0, 0]
    assert list(traces["ran → succeeded"].x) == [8] and list(traces["ran → succeeded"].base) == [2]
    assert traces["ran → failed"].marker.color == figures.STATUS_COLORS["failed"]
    assert traces["cancelled before start"].customdata[0][0] == "run_c"
    assert fig.layout.xaxis.type == "linear"


def test_timeline_on_the_wall_clock_measures_bars_in_milliseconds():
    fig = figures.timeline([row("run_a", "succeeded", 0, 2, 10)], align="clock")
    queued = next(t for t in fig.data if t.name == "queued")
    assert list(queued.x) == [2000] and fig.layout.xaxis.type == "date"


def test_empty_figures_explain_themselves():
    for fig in (figures.timeline([]), figures.status_over_time([], 3600),
                figures.interruption_trend([], 86400), figures.lease_countdown([], 10),
                figures.outcome_rates([]), figures.latency_percentiles([])):
        assert fig.data == () and fig.layout.annotations[0].text


def test_tree_elements_mark_failed_interrupted_and_focused_runs():
    nodes = [row("run_root", "failed", 0, 1, 9), row("run_kid", "interrupted", 2, 3, 4, "run_root"),
             row("run_ok", "succeeded", 2, 3, 4, "run_root"),
             row("run_stray", "queued", 2, parent="run_elsewhere")]
    elements = figures.tree_elements(nodes, focus="run_kid")
    classes = {e["data"]["id"]: e["classes"] for e in elements if "id" in e["data"]}
    assert classes == {"run_root": "failed", "run_kid": "interrupted focus", "run_ok": "succeeded",
                       "run_stray": "queued"}
    edges = [(e["data"]["source"], e["data"]["target"]) for e in elements if "source" in e["data"]]
    assert edges == [("run_root", "run_kid"), ("run_root", "run_ok")]
    label = next(e for e in elements if e["data"].get("id") == "run_root")["data"]["label"]
    assert label == "Bot v1\nfailed · 8.0 s"
    assert figures.tree_layout("run_root")["roots"] == "[id = 'run_root']"


def test_lease_countdown_colours_risk():
    leases = [{"run_id": "run_a", "executor_instance_id": "w", "seconds_left": -3.0, "expired": True,
               "at_risk": False, "lease_expires_at": "x"},
              {"run_id": "run_b", "executor_instance_id": "w", "seconds_left": 4.0, "expired": False,
               "at_risk": True, "lease_expires_at": "x"}]
    [bars] = figures.lease_countdown(leases, 10).data
    assert list(bars.marker.color) == ["#212529", "#dc3545"]


def test_windows_from_the_url():
    assert params.resolve_window("24h", now=NOW) == TimeWindow(NOW - timedelta(hours=24), None)
    assert params.resolve_window("all", now=NOW) == TimeWindow()
    assert params.resolve_window("bogus", now=NOW) == TimeWindow(NOW - timedelta(days=7), None)
    custom = params.resolve_window("custom", "2026-04-01", "2026-04-02", now=NOW)
    assert custom == TimeWindow(datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 4, 3, tzinfo=UTC))
    assert params.resolve_window("custom", "nonsense", None, now=NOW) == TimeWindow()
    assert params.window_key("30d") == "30d" and params.window_key("x", "all") == "all"
    assert params.describe_window("custom", "2026-04-01", None) == "2026-04-01 to now (UTC days)"


def test_query_strings_keep_only_what_differs_from_the_defaults():
    assert params.query_string({"window": "7d", "status": None, "q": ""}, {"window": "7d"}) == ""
    assert params.query_string({"window": "30d", "q": "a b&c"}, {"window": "7d"}) == \
        "?window=30d&q=a+b%26c"


def test_twin_links_rename_the_filters_and_state_the_window():
    assert params.twin_href("/api/messages") == "/api/messages"
    assert params.twin_href("/api/messages", {"q": "a b&c", "agent": "bot", "owner": None,
                                              "session": ""}, window=("7d", None, None),
                            limit=50) == "/api/messages?q=a+b%26c&agent_id=bot&window=7d&limit=50"
    # custom dates: the bounds the page reads, whole UTC days; none picked is all time
    assert params.twin_href("/api/interrupted-runs", {"executor": "w-1"},
                            window=("custom", "2026-04-01", "2026-04-02"),
                            bounds="interrupted") == (
        "/api/interrupted-runs?executor_instance_id=w-1"
        "&interrupted_after=2026-04-01T00:00:00Z&interrupted_before=2026-04-03T00:00:00Z")
    assert params.twin_window("custom", None, "2026-04-02") == {
        "created_after": None, "created_before": datetime(2026, 4, 3, tzinfo=UTC)}
    assert params.twin_window("custom", None, None) == {"window": "all"}
    assert params.twin_href("/api/timeline", {"status": None}, roots_only=True) == (
        "/api/timeline?roots_only=true")
    assert params.twin_href("/api/timeline", roots_only=False, limit=0) == "/api/timeline?limit=0"
    assert params.twin_href("/api/agent-runs", created_after=NOW) == (
        "/api/agent-runs?created_after=2026-05-01T12:00:00Z")
    with pytest.raises(KeyError):  # every page filter has its twin's name in one table
        params.twin_href("/api/messages", {"nonsense": 1})


@pytest.mark.parametrize("value, expected", [
    ("run_01abc", "run_01abc"), ("  sess_1  ", "sess_1"), ("worker-eu-1", "worker-eu-1"),
    ("<script>", None), ("", None), (None, None), ("a b", None),
])
def test_identifiers_from_the_url(value, expected):
    assert params.identifier(value) == expected


def test_integers_are_clamped():
    assert params.integer("5000", 10, low=1, high=3600) == 3600
    assert params.integer("x", 10, low=1, high=3600) == 10
    assert params.integer(0, 10, low=1, high=3600) == 1


def test_grid_links_only_for_server_made_ids():
    assert components.link_cell("runs", "run_01abc") == "[run_01abc](/runs/run_01abc)"
    assert components.link_cell("runs", "x](javascript:alert(1))") == "x(javascript:alert(1))"
    assert components.link_cell("runs", None) == ""


def test_pager_walks_forward_and_back_and_resets_on_filter_changes():
    start = components.pager_step(None, None, "p")
    assert start == {"cursors": [None], "page": 0, "next": None}
    state, newer_off, older_off, label = components.pager_view(start, 50, "c1")
    assert (newer_off, older_off, label) == (True, False, "rows 1–50 · more below")
    state = components.pager_step(state, "p-next", "p")
    assert state["cursors"] == [None, "c1"] and state["page"] == 1
    state, *_ = components.pager_view(state, 50, "c2")
    state = components.pager_step(state, "p-next", "p")
    assert state["cursors"] == [None, "c1", "c2"] and state["page"] == 2
    state = components.pager_step(state, "p-prev", "p")
    assert state["page"] == 1 and state["cursors"][state["page"]] == "c1"
    assert components.pager_step(state, "p-status", "p") == start
    last, newer_off, older_off, label = components.pager_view(state, 7, None)
    assert (newer_off, older_off, label) == (False, True, "rows 51–57")
    assert components.pager_step(last, "p-next", "p")["page"] == 1  # no next page: stay


@pytest.mark.parametrize("part, after, last_seq, expected", [
    ("first", 400, 450, 0),
    ("prev", 400, 450, 200), ("prev", 0, 450, 0),
    ("next", 0, 450, 200), ("next", 200, 450, 400), ("next", 400, 450, 400),
    ("next", 200, 400, 200),  # 201–400 is already the last page
    ("last", 0, 450, 400), ("last", 0, 400, 200), ("last", 0, 200, 0), ("last", 0, 201, 200),
    ("last", 0, 0, 0), ("last", 0, 1, 0),
    (None, 200, 450, 200),
])
def test_event_log_pages_are_whole_seq_ranges_and_last_holds_the_final_event(part, after, last_seq,
                                                                              expected):
    from dashboards import event_log

    start = event_log.page_after(part, after, last_seq)
    assert start == expected and start % event_log.PAGE_SIZE == 0
    if part == "last" and last_seq:
        assert start < last_seq <= start + event_log.PAGE_SIZE
