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
               ("agents-url", "search"), ("agents-json", "href"), ("agents-dates-col", "style")]
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
               ("overview-url", "search"), ("overview-json", "href"),
               ("overview-dates-col", "style")]
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
               ("messages-url", "search"), ("messages-json", "href"),
               ("messages-dates-col", "style")]
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
               ("timeline-url", "search"), ("timeline-json", "href"),
               ("timeline-dates-col", "style")]
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
               ("interrupted-url", "search"), ("interrupted-json", "href"),
               ("interrupted-dates-col", "style")]
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
               ("leases-leases-note", "children"),
               ("leases-url", "search"), ("leases-json", "href")]
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


# --- each page's "JSON" link: its filters as its twin's parameters ------------------------------

def paged_outputs(prefix: str) -> list[tuple[str, str]]:
    return [(f"{prefix}-grid", "rowData"), (f"{prefix}-grid", "style"),
            (f"{prefix}-empty", "children"), (f"{prefix}-empty", "style"),
            (f"{prefix}-pager", "data"), (f"{prefix}-prev", "disabled"),
            (f"{prefix}-next", "disabled"), (f"{prefix}-page-label", "children")]


def follow(site, href: str) -> dict:
    """What the page's JSON link returns (as a viewer: the link's own query string, untouched)."""
    assert href.startswith("/api/") and "?" in href, href
    reply = site["http"].request("GET", href, token=site["tokens"]["viewer"])
    assert reply.status == 200, (href, reply)
    return reply.json()


def component(tree, id_: str) -> dict | None:
    """The serialised component with this id inside a callback's output."""
    if isinstance(tree, list):
        return next((c for c in (component(t, id_) for t in tree) if c is not None), None)
    if isinstance(tree, dict):
        if tree.get("props", {}).get("id") == id_:
            return tree["props"]
        return component(tree.get("props", {}).get("children"), id_)
    return None


def test_every_pages_json_link_returns_what_the_page_shows(site, db, ledger):
    """With an agent, a window (a preset, then custom dates) and the page's other filters set,
    each page's JSON link, followed, returns the page's rows and figures; the bare twin path
    (the page's defaults) returns something else, so the filters did travel in the link."""
    from dashboards.pages.agents import cost_text  # registered by the app

    page = site["page"]
    now = datetime.now(UTC)

    # leases: seen and risk → seen_minutes and at_risk_seconds, as many leases as the page reads
    shown = call(page, [("leases-kpis", "children"), ("leases-clock", "children"),
                        ("leases-executors", "rowData"), ("leases-executors", "style"),
                        ("leases-executors-empty", "children"),
                        ("leases-executors-empty", "style"), ("leases-chart", "figure"),
                        ("leases-leases", "rowData"), ("leases-leases", "style"),
                        ("leases-leases-empty", "children"), ("leases-leases-empty", "style"),
                        ("leases-leases-note", "children"), ("leases-url", "search"),
                        ("leases-json", "href")],
                 [("leases-tick", "n_intervals", 1), ("leases-seen", "value", 30),
                  ("leases-risk", "value", 3600)],
                 [("leases-url", "search", "")], changed=["leases-risk.value"])
    href = shown["leases-json"]["href"]
    assert href == "/api/leases?seen_minutes=30&at_risk_seconds=3600&limit=200"
    twin = follow(site, href)
    assert [r["run"] for r in shown["leases-leases"]["rowData"]] == [
        ui.link_cell("runs", i["run_id"]) for i in twin["items"]]
    # All three leases are at risk within the hour, unless the 8-second one has just expired.
    assert (twin["at_risk"] + twin["expired_unreconciled"], twin["seen_within_minutes"]) == (3, 30)
    kpis = texts(shown["leases-kpis"]["children"])
    assert int(kpis[kpis.index("At risk") + 1]) + int(
        kpis[kpis.index("Expired, not yet reconciled") + 1]) == 3
    bare = get(site, "/api/leases")
    assert (bare["seen_within_minutes"], bare["at_risk_seconds"]) == (15, 10)

    # Three days old: outside the 24-hour and custom windows below, inside the twins' defaults.
    old = now - timedelta(days=3)
    chat = h.chat(db, owner="alice", agent_id="planner", when=old)
    h.answered(db, chat, "old question", "an old answer number 9", owner="alice", when=old)
    chat = h.chat(db, owner="alice", agent_id="searcher", when=old)
    gone = h.ask(db, chat, "q", owner="alice", when=old)
    h.start(db, gone.run_id, old + timedelta(seconds=1), "w-old")
    h.executor_gone(db, "w-old", old + timedelta(seconds=5), "executor_shutdown")
    days = ((now - timedelta(days=1)).date().isoformat(), now.date().isoformat())
    bounds = (f"{days[0]}T00:00:00Z", f"{(now + timedelta(days=1)).date().isoformat()}T00:00:00Z")

    # messages: text, agent and window → q, agent_id and window (custom: created_after/before)
    def messages(q, window, since=None, until=None):
        inputs = [("messages-q", "value", q), ("messages-agent", "value", "planner"),
                  ("messages-owner", "value", None), ("messages-session", "value", None),
                  ("messages-window", "value", window), ("messages-dates", "start_date", since),
                  ("messages-dates", "end_date", until), ("messages-prev", "n_clicks", None),
                  ("messages-next", "n_clicks", None)]
        return call(page, [*paged_outputs("messages"), ("messages-url", "search"),
                           ("messages-json", "href"), ("messages-dates-col", "style")],
                    inputs, [("messages-pager", "data", None), ("messages-url", "search", "")],
                    changed=["messages-q.value"])

    shown = messages("number", "24h")
    href = shown["messages-json"]["href"]
    assert href == "/api/messages?q=number&agent_id=planner&window=24h&limit=50"
    rows = shown["messages-grid"]["rowData"]
    assert [r["id"] for r in rows] == [i["id"] for i in follow(site, href)["items"]]
    assert sorted(r["id"] for r in rows) == sorted(ledger["answers"])
    assert len(get(site, "/api/messages", q="number")["items"]) == 6  # the old answer too
    shown = messages("number 3", "custom", *days)
    href = shown["messages-json"]["href"]
    assert href == ("/api/messages?q=number+3&agent_id=planner"
                    f"&created_after={bounds[0]}&created_before={bounds[1]}&limit=50")
    rows = shown["messages-grid"]["rowData"]
    assert [r["id"] for r in rows] == [i["id"] for i in follow(site, href)["items"]]
    assert [r["id"] for r in rows] == [ledger["answers"][3]]

    # interrupted: reason, executor, agent, window → its twin's names, the window as
    # interrupted_after/interrupted_before when custom; the KPIs, the trend and the listing
    def interrupted(reason, executor, window, since=None, until=None):
        inputs = [("interrupted-reason", "value", reason),
                  ("interrupted-executor", "value", executor),
                  ("interrupted-agent", "value", "searcher"),
                  ("interrupted-window", "value", window),
                  ("interrupted-dates", "start_date", since),
                  ("interrupted-dates", "end_date", until)]
        top = call(page, [("interrupted-kpis", "children"), ("interrupted-trend", "figure"),
                          ("interrupted-url", "search"), ("interrupted-json", "href"),
                          ("interrupted-dates-col", "style")],
                   inputs, [("interrupted-url", "search", "")],
                   changed=["interrupted-agent.value"])
        listing = call(page, paged_outputs("interrupted"),
                       inputs + [("interrupted-prev", "n_clicks", None),
                                 ("interrupted-next", "n_clicks", None)],
                       [("interrupted-pager", "data", None)],
                       changed=["interrupted-agent.value"])
        return top, listing["interrupted-grid"]["rowData"]

    for reason, executor, window, expected in (
            ("executor_shutdown", None, ("24h",), ledger["interrupted"][1:]),
            ("any", "w-stop-1", ("custom", *days), ledger["interrupted"][1:2])):
        top, rows = interrupted(reason, executor, *window)
        href = top["interrupted-json"]["href"]
        if window[0] == "custom":
            assert href == ("/api/interrupted-runs?executor_instance_id=w-stop-1&agent_id=searcher"
                            f"&interrupted_after={bounds[0]}&interrupted_before={bounds[1]}"
                            "&limit=50")
        else:
            assert href == ("/api/interrupted-runs?reason=executor_shutdown&agent_id=searcher"
                            "&window=24h&limit=50")
        twin = follow(site, href)
        assert [r["run"] for r in rows] == [ui.link_cell("runs", i["run_id"]) for i in twin["items"]]
        assert sorted(i["run_id"] for i in twin["items"]) == sorted(expected)
        shown = texts(top["interrupted-kpis"]["children"])
        by_reason = twin["trend"]["by_reason"]
        assert shown[shown.index("Interrupted") + 1] == str(sum(by_reason.values()))
        for name in ("lease_expired", "executor_shutdown"):
            assert shown[shown.index(name.replace("_", " ")) + 1] == str(by_reason.get(name, 0))
        assert [t["name"] for t in top["interrupted-trend"]["figure"]["data"]] == sorted(
            {r["reason"] for r in twin["trend"]["rows"]})
    assert len(get(site, "/api/interrupted-runs", reason="executor_shutdown",
                   agent_id="searcher")["items"]) == 3  # the default 14 days: the old one too

    # agents: both grids come from one query of the window, so the link is the window (its
    # agent_id would leave the other agents out of the first grid)
    def agents(window, since=None, until=None):
        inputs = [("agents-window", "value", window), ("agents-dates", "start_date", since),
                  ("agents-dates", "end_date", until), ("agents-agent", "value", "searcher"),
                  ("agents-a", "value", "1"), ("agents-b", "value", "1")]
        return call(page, [("agents-all", "rowData"), ("agents-note", "children"),
                           ("agents-detail", "children"), ("agents-url", "search"),
                           ("agents-json", "href"), ("agents-dates-col", "style")],
                    inputs, [("agents-url", "search", "")], changed=["agents-window.value"])

    for window, query in ((("24h",), "window=24h"),
                          (("custom", *days), f"created_after={bounds[0]}"
                                              f"&created_before={bounds[1]}")):
        shown = agents(*window)
        href = shown["agents-json"]["href"]
        assert href == f"/api/agent-outcomes?{query}&limit=500"
        twin = follow(site, href)
        assert twin["next_cursor"] is None and twin["groups_truncated"] is False
        totals = [i for i in twin["items"] if i["version"] is None]
        assert [(r["label"], r["runs"], r["succeeded_count"], r["failed_count"],
                 r["interrupted_count"], r["p95"], r["cost"]) for r in shown["agents-all"][
            "rowData"]] == [(f"{a['name']} ({a['agent_id']})", a["runs"],
                             a["by_status"]["succeeded"], a["by_status"]["failed"],
                             a["by_status"]["interrupted"], ui.seconds(a["latency_p95"]),
                             cost_text(a)) for a in totals]
        versions = component(shown["agents-detail"]["children"], "agents-versions")
        assert [(r["label"], r["runs"], r["interrupted_count"]) for r in versions["rowData"]] == [
            (f"v{i['version']} {i['name']}", i["runs"], i["by_status"]["interrupted"])
            for i in twin["items"] if i["agent_id"] == "searcher" and i["version"] is not None]
        searcher = next(a for a in totals if a["agent_id"] == "searcher")
        assert (searcher["runs"], searcher["by_status"]["interrupted"]) == (4, 3)
    bare = get(site, "/api/agent-outcomes")["items"]  # the page's default 30 days
    assert next(i for i in bare if i["agent_id"] == "searcher" and i["version"] is None)[
        "runs"] == 5

    # timeline: status, agent, roots, limit → status, agent_id, roots_only, limit; the figure's
    # runs are the twin's first page
    shown = call(page, [("timeline-chart", "figure"), ("timeline-note", "children"),
                        ("timeline-url", "search"), ("timeline-json", "href"),
                        ("timeline-dates-col", "style")],
                 [("timeline-status", "value", "running"), ("timeline-agent", "value", "planner"),
                  ("timeline-roots", "value", "roots"), ("timeline-limit", "value", "1000"),
                  ("timeline-align", "value", "clock"), ("timeline-window", "value", "24h"),
                  ("timeline-dates", "start_date", None), ("timeline-dates", "end_date", None)],
                 [("timeline-url", "search", "")], changed=["timeline-status.value"])
    href = shown["timeline-json"]["href"]
    # the page's 1000 are more than a twin page's 500: its next_cursor goes on
    assert href == ("/api/timeline?status=running&agent_id=planner&window=24h&roots_only=true"
                    "&limit=500")
    twin = follow(site, href)
    drawn = [point[0] for point in shown["timeline-chart"]["figure"]["data"][0]["customdata"]]
    assert drawn == [i["run_id"] for i in twin["items"]]
    assert sorted(drawn) == sorted(ledger["live"])
    assert shown["timeline-note"]["children"].startswith(f"{twin['total']} runs created")

    # overview: the window
    for window, query in ((("24h",), "window=24h"),
                          (("custom", *days), f"created_after={bounds[0]}"
                                              f"&created_before={bounds[1]}")):
        shown = call(page, [("overview-kpis", "children"), ("overview-status-chart", "figure"),
                            ("overview-unfinished", "children"),
                            ("overview-interruptions", "children"), ("overview-url", "search"),
                            ("overview-json", "href"), ("overview-dates-col", "style")],
                     [("overview-window", "value", window[0]),
                      ("overview-dates", "start_date", (window[1:] or (None,))[0]),
                      ("overview-dates", "end_date", (window[2:] or (None,))[0])],
                     [("overview-url", "search", "")], changed=["overview-window.value"])
        href = shown["overview-json"]["href"]
        assert href == f"/api/overview?{query}"
        twin = follow(site, href)
        kpis = texts(shown["overview-kpis"]["children"])
        assert kpis[kpis.index("Runs created") + 1] == str(sum(twin["totals"].values())) == "13"
        assert [r["run_id"] for r in twin["recent_interruptions"]] == [
            r for r in texts(shown["overview-interruptions"]["children"]) if r.startswith("run_")]
    assert sum(get(site, "/api/overview")["totals"].values()) == 15  # 7 days: the old two too

    # runs: its API list takes no preset, so the window goes as the bounds the page read
    shown = call(page, [*paged_outputs("runs"), ("runs-url", "search"), ("runs-json", "href"),
                        ("runs-dates-col", "style")],
                 [("runs-status", "value", "interrupted"), ("runs-agent", "value", "searcher"),
                  ("runs-session", "value", None), ("runs-root", "value", None),
                  ("runs-window", "value", "24h"), ("runs-dates", "start_date", None),
                  ("runs-dates", "end_date", None), ("runs-prev", "n_clicks", None),
                  ("runs-next", "n_clicks", None)],
                 [("runs-pager", "data", None), ("runs-url", "search", "")],
                 changed=["runs-status.value"])
    href = shown["runs-json"]["href"]
    assert href.startswith("/api/agent-runs?status=interrupted&agent_id=searcher&created_after=")
    after = datetime.fromisoformat(href.split("created_after=")[1].split("&")[0])
    assert abs(after - (now - timedelta(hours=24))) < timedelta(minutes=5)
    twin = follow(site, href)
    assert [r["run"] for r in shown["runs-grid"]["rowData"]] == [
        ui.link_cell("runs", i["id"]) for i in twin["items"]]
    assert sorted(i["id"] for i in twin["items"]) == sorted(ledger["interrupted"])
