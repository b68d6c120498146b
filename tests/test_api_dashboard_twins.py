"""The JSON twins of the dashboards (CONTRACT §9): who may read them, how they page, and that
each returns exactly what its page shows (the page's callback over HTTP, or the same query)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from support import history as h
from support.api import FlaskHttp
from support.dashboards import call, logged_in, make_app, texts, tokens

from agentledger.api.routes_dashboards import DEFAULT_WINDOWS
from dashboards import components as ui
from queries.common import TimeWindow
from queries.interrupted_runs import InterruptedFilters, interrupted_runs, interruption_trend
from queries.lease_health import lease_health
from queries.status_timeline import TimelineFilters, status_timeline

TWINS = ("/api/overview", "/api/messages", "/api/timeline", "/api/interrupted-runs",
         "/api/leases", "/api/agent-outcomes")
LISTS = ("/api/messages", "/api/timeline", "/api/interrupted-runs", "/api/leases",
         "/api/agent-outcomes")


@pytest.fixture
def ledger(db):
    """A few hours of history ending now: answers, a failure, interruptions, live leases."""
    now = datetime.now(UTC)
    base = now - timedelta(hours=3)
    h.agent(db, "planner", names=("Planner", "Planner II"))
    h.agent(db, "searcher")
    found: dict[str, list[str]] = {"answers": [], "interrupted": [], "live": []}
    for n in range(5):
        chat = h.chat(db, owner="alice" if n % 2 else "bob", agent_id="planner", when=base)
        run = h.answered(db, chat, f"question {n}", f"answer number {n}", owner="alice",
                         when=base + timedelta(minutes=n))
        found["answers"].append(run.answer_id)
    chat = h.chat(db, owner="alice", agent_id="searcher", when=base)
    failed = h.ask(db, chat, "q", owner="alice", when=base + timedelta(minutes=10))
    h.start(db, failed.run_id, base + timedelta(minutes=10, seconds=1))
    h.usage(db, failed.run_id, base + timedelta(minutes=10, seconds=2), 100, 20, 0.5)
    h.fail(db, failed.run_id, base + timedelta(minutes=10, seconds=3))
    for n, reason in enumerate(("lease_expired", "executor_shutdown", "executor_shutdown")):
        chat = h.chat(db, owner="alice", agent_id="searcher", when=base)
        run = h.ask(db, chat, "q", owner="alice", when=base + timedelta(minutes=20 + n))
        started = base + timedelta(minutes=20 + n, seconds=1)
        if reason == "lease_expired":
            h.start(db, run.run_id, started, "w-gone", lease_seconds=30)
            h.expire(db, run.run_id, started + timedelta(seconds=60))
        else:
            h.start(db, run.run_id, started, f"w-stop-{n}")
            h.executor_gone(db, f"w-stop-{n}", started + timedelta(seconds=5), reason)
        found["interrupted"].append(run.run_id)
    for n, lease in enumerate((600, 8, 900)):
        chat = h.chat(db, owner="alice", agent_id="planner", when=base)
        run = h.ask(db, chat, "q", owner="alice", when=now - timedelta(seconds=30 - n))
        h.start(db, run.run_id, datetime.now(UTC) - timedelta(seconds=1), f"exec-{n}",
                lease_seconds=lease)
        found["live"].append(run.run_id)
    chat = h.chat(db, owner="alice", agent_id="planner", when=base)
    h.ask(db, chat, "waiting", owner="alice", when=now - timedelta(seconds=5))
    return found


@pytest.fixture
def site(db, ledger):
    app = make_app(db)
    keys = tokens(db)
    yield {"app": app, "http": FlaskHttp(app.test_client()), "tokens": keys,
           "page": logged_in(app, keys["viewer"])}
    app.extensions["agentledger"].close()


def get(site, path, role="viewer", **query):
    reply = site["http"].request("GET", path, token=site["tokens"][role], query=query)
    assert reply.status == 200, (path, reply)
    return reply.json()


def all_pages(site, path, limit, **query):
    items, cursor, pages = [], None, 0
    while True:
        body = get(site, path, limit=limit, **({"cursor": cursor} if cursor else {}), **query)
        assert len(body["items"]) <= limit
        items += body["items"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return items, pages
        assert body["items"], "a page with a next_cursor is never empty"


def test_viewers_and_admins_read_every_twin_others_are_refused(site):
    http, keys = site["http"], site["tokens"]
    for path in TWINS:
        assert http.request("GET", path).status == 401, path
        for role, status in (("user", 403), ("executor", 403), ("viewer", 200), ("admin", 200)):
            reply = http.request("GET", path, token=keys[role])
            assert reply.status == status, (path, role, reply)
            if status == 200 and path in LISTS:
                assert {"items", "next_cursor"} <= set(reply.json())
            elif status != 200:
                assert reply.json()["error"]["code"] == "forbidden"


def test_every_list_twin_pages_through_everything_exactly_once(site):
    key = {"/api/messages": "id", "/api/timeline": "run_id", "/api/interrupted-runs": "run_id",
           "/api/leases": "run_id", "/api/agent-outcomes": None}
    for path in LISTS:
        query = {} if path in ("/api/leases",) else {"window": "all"}
        whole = get(site, path, limit=500, **query)
        assert whole["next_cursor"] is None
        paged, pages = all_pages(site, path, 2, **query)
        ident = key[path]
        ids = [(i["agent_id"], i["version"]) if ident is None else i[ident] for i in paged]
        assert len(ids) == len(set(ids)), path
        whole_ids = [(i["agent_id"], i["version"]) if ident is None else i[ident]
                     for i in whole["items"]]
        if path == "/api/timeline":  # each page oldest first, each next page older
            assert sorted(ids) == sorted(whole_ids)
        else:
            assert ids == whole_ids, path
        assert pages == -(-len(whole["items"]) // 2) and len(whole["items"]) >= 3, path


def test_limits_and_cursors_are_checked(site):
    http, viewer = site["http"], site["tokens"]["viewer"]
    for path in LISTS:
        for bad in ({"limit": 0}, {"limit": 501}, {"cursor": "not-a-cursor"}):
            reply = http.request("GET", path, token=viewer, query=bad)
            assert reply.status == 400 and reply.json()["error"]["code"] == "invalid_request", (
                path, bad, reply)
    naive = http.request("GET", "/api/messages", token=viewer,
                         query={"created_after": "2026-01-01T00:00:00"})
    assert naive.status == 400
    assert len(get(site, "/api/messages", limit=50)["items"]) == 5  # default 50, all answers
    assert get(site, "/api/messages", q="NUMBER 3")["items"][0]["content_preview"] == (
        "answer number 3")


def test_defaults_are_the_pages_defaults():
    from dashboards import params
    from dashboards.pages import agents, interrupted, messages, timeline

    assert DEFAULT_WINDOWS == {"overview": params.DEFAULT_WINDOW, "messages": messages.DEFAULT_WINDOW,
                               "timeline": timeline.DEFAULT_WINDOW,
                               "interrupted": interrupted.DEFAULT_WINDOW,
                               "agents": agents.DEFAULT_WINDOW}


def test_agent_outcomes_equal_the_agents_page(site, ledger):
    outputs = [("agents-all", "rowData"), ("agents-note", "children"), ("agents-detail", "children"),
               ("agents-url", "search"), ("agents-dates-col", "style")]
    inputs = [("agents-window", "value", "30d"), ("agents-dates", "start_date", None),
              ("agents-dates", "end_date", None), ("agents-agent", "value", None),
              ("agents-a", "value", None), ("agents-b", "value", None)]
    page = call(site["page"], outputs, inputs, [("agents-url", "search", "")])["agents-all"]["rowData"]
    twin = get(site, "/api/agent-outcomes")
    assert twin["groups_truncated"] is False
    agents = [i for i in twin["items"] if i["version"] is None]
    assert [(r["label"], r["runs"], r["succeeded"], r["failed"], r["p95"], r["cost"]) for r in page] == [
        (f"{a['name']} ({a['agent_id']})", a["runs"], ui.percent(a["rates"]["succeeded"]),
         ui.percent(a["rates"]["failed"]), ui.seconds(a["latency_p95"]), f"${a['cost_usd']:,.4f}")
        for a in agents]
    planner = next(a for a in agents if a["agent_id"] == "planner")
    assert planner["by_status"]["succeeded"] == 5 and planner["by_status"]["running"] == 3
    searcher = next(a for a in agents if a["agent_id"] == "searcher")
    assert searcher["by_status"]["failed"] == 1 and searcher["by_status"]["interrupted"] == 3
    assert searcher["input_tokens"] == 100 and searcher["cost_usd"] == 0.5
    versions = [(i["agent_id"], i["version"]) for i in twin["items"] if i["version"] is not None]
    assert ("planner", 2) in versions and all(k in twin["items"][0] for k in (
        "latency_p50", "latency_p99", "output_tokens"))
    only = get(site, "/api/agent-outcomes", agent_id="searcher")["items"]
    assert {i["agent_id"] for i in only} == {"searcher"}


def test_overview_equals_the_overview_page(site):
    outputs = [("overview-kpis", "children"), ("overview-status-chart", "figure"),
               ("overview-unfinished", "children"), ("overview-interruptions", "children"),
               ("overview-url", "search"), ("overview-dates-col", "style")]
    inputs = [("overview-window", "value", "7d"), ("overview-dates", "start_date", None),
              ("overview-dates", "end_date", None)]
    page = call(site["page"], outputs, inputs, [("overview-url", "search", "")])
    twin = get(site, "/api/overview")
    shown = texts(page["overview-kpis"]["children"])
    assert str(sum(twin["totals"].values())) == shown[shown.index("Runs created") + 1]
    assert sum(twin["totals"].values()) == 13
    lease = twin["leases"]
    assert f"{lease['live_leases']} ({lease['at_risk']})" in shown
    assert lease["live_leases"] == 3 and lease["at_risk"] == 1
    page_runs = texts(page["overview-unfinished"]["children"])
    assert all(r["run_id"] in page_runs for r in twin["unfinished_runs"])
    assert len(twin["unfinished_runs"]) == 4
    assert [r["run_id"] for r in twin["recent_interruptions"]] == [
        r for r in texts(page["overview-interruptions"]["children"]) if r.startswith("run_")]


def test_messages_timeline_interrupted_and_leases_equal_their_pages(site, db, ledger):
    # messages: the page's first page of rows, in order
    outputs = [("messages-grid", "rowData"), ("messages-grid", "style"),
               ("messages-empty", "children"), ("messages-empty", "style"),
               ("messages-pager", "data"), ("messages-prev", "disabled"),
               ("messages-next", "disabled"), ("messages-page-label", "children"),
               ("messages-url", "search"), ("messages-dates-col", "style")]
    inputs = [("messages-q", "value", "answer"), ("messages-agent", "value", "planner"),
              ("messages-owner", "value", None), ("messages-session", "value", None),
              ("messages-window", "value", "all"), ("messages-dates", "start_date", None),
              ("messages-dates", "end_date", None), ("messages-prev", "n_clicks", None),
              ("messages-next", "n_clicks", None)]
    page = call(site["page"], outputs, inputs, [("messages-pager", "data", None),
                                                ("messages-url", "search", "")])
    twin = get(site, "/api/messages", q="answer", agent_id="planner")
    assert [r["id"] for r in page["messages-grid"]["rowData"]] == [i["id"] for i in twin["items"]]
    assert sorted(i["id"] for i in twin["items"]) == sorted(ledger["answers"])

    # timeline: the note's total and the rows of the same query
    outputs = [("timeline-chart", "figure"), ("timeline-note", "children"),
               ("timeline-url", "search"), ("timeline-dates-col", "style")]
    inputs = [("timeline-status", "value", "any"), ("timeline-agent", "value", None),
              ("timeline-roots", "value", "all"), ("timeline-limit", "value", "100"),
              ("timeline-align", "value", "start"), ("timeline-window", "value", "24h"),
              ("timeline-dates", "start_date", None), ("timeline-dates", "end_date", None)]
    page = call(site["page"], outputs, inputs, [("timeline-url", "search", "")])
    twin = get(site, "/api/timeline", limit=100)
    assert page["timeline-note"]["children"].startswith(f"{twin['total']} runs created")
    window = TimeWindow(datetime.fromisoformat(twin["window"]["start"]), None)
    with db.read() as s:
        same = status_timeline(s, window, TimelineFilters(), limit=100)
    assert [r["run_id"] for r in same.rows] == [i["run_id"] for i in twin["items"]]
    assert {i["status"] for i in get(site, "/api/timeline", status="failed")["items"]} == {"failed"}

    # interrupted: the listing and the KPIs by reason
    twin = get(site, "/api/interrupted-runs")
    filters = InterruptedFilters(window=TimeWindow(
        datetime.fromisoformat(twin["window"]["start"]), None))
    with db.read() as s:
        assert [i["run_id"] for i in interrupted_runs(s, filters).items] == [
            i["run_id"] for i in twin["items"]]
        assert interruption_trend(s, filters).by_reason == twin["trend"]["by_reason"]
    assert twin["trend"]["by_reason"] == {"lease_expired": 1, "executor_shutdown": 2}
    outputs = [("interrupted-kpis", "children"), ("interrupted-trend", "figure"),
               ("interrupted-url", "search"), ("interrupted-dates-col", "style")]
    inputs = [("interrupted-reason", "value", "any"), ("interrupted-executor", "value", None),
              ("interrupted-agent", "value", None), ("interrupted-window", "value", "14d"),
              ("interrupted-dates", "start_date", None), ("interrupted-dates", "end_date", None)]
    shown = texts(call(site["page"], outputs, inputs,
                       [("interrupted-url", "search", "")])["interrupted-kpis"]["children"])
    assert shown[shown.index("executor shutdown") + 1] == "2"
    assert [i["run_id"] for i in get(site, "/api/interrupted-runs", reason="lease_expired")[
        "items"]] == ledger["interrupted"][:1]

    # leases: the page's rows and KPIs
    outputs = [("leases-kpis", "children"), ("leases-clock", "children"),
               ("leases-executors", "rowData"), ("leases-executors", "style"),
               ("leases-executors-empty", "children"), ("leases-executors-empty", "style"),
               ("leases-chart", "figure"), ("leases-leases", "rowData"), ("leases-leases", "style"),
               ("leases-leases-empty", "children"), ("leases-leases-empty", "style"),
               ("leases-leases-note", "children"), ("leases-url", "search")]
    page = call(site["page"], outputs, [("leases-tick", "n_intervals", 1), ("leases-seen", "value", 15),
                                        ("leases-risk", "value", 10)],
                [("leases-url", "search", "")], changed=["leases-seen.value"])
    twin = get(site, "/api/leases")
    assert [r["run"] for r in page["leases-leases"]["rowData"]] == [
        ui.link_cell("runs", i["run_id"]) for i in twin["items"]]
    assert [i["run_id"] for i in twin["items"]] == [ledger["live"][1], ledger["live"][0],
                                                    ledger["live"][2]]
    assert (twin["live_leases"], twin["at_risk"], twin["queued"]) == (3, 1, 1)
    assert [e["executor_instance_id"] for e in page["leases-executors"]["rowData"]] == [
        e["executor_instance_id"] for e in twin["executors"]]
    with db.read() as s:
        assert lease_health(s).live_leases == twin["live_leases"]
    assert get(site, "/api/leases", at_risk_seconds=3600)["at_risk"] == 3
