"""Dashboard callbacks given what no page of ours sends: every Input and State value can be any
JSON (a tampered store, a hand-made request, a URL typed by someone). The answer is the page
drawn from what can be read of it (200; 204 when the callback leaves everything as it is) or
``400 invalid_request`` in the JSON envelope, never a 500. And the filters a page shows are the ones
it applies: a free-text filter (owner, executor, actor, session, root run) is applied as typed,
never dropped because it does not look like an id."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import pytest
from support import history as h
from support.api import FlaskHttp
from support.dashboards import csrf_headers, logged_in, make_app, texts, tokens

from ingest.admin_log import Actor, record

# What any dependency may be sent instead of its value.
HOSTILE = ("garbage", -1, 10**30, [], {}, ["x"], {"a": 1}, None, True, "9999-12-31",
           "0001-01-01", 1.5, "", "  ", "a\x00b", "\ud800", "x" * 5000, "10000-01-01",
           "2026-02-30", ["2026-01-01"], {"cursors": [None], "page": 5, "next": "x"},
           {"points": "x"}, {"points": [{"customdata": "x"}]}, {"id": ["x"]},
           {"run_id": {"a": 1}, "after": "x"})


@pytest.fixture
def ledger(db):
    """Answers of two owners (one an e-mail address), runs interrupted on two executors (one
    named with a space and a slash), and admin actions by two actors."""
    h.agent(db, "planner", names=("Planner", "Planner II"))
    h.agent(db, "searcher")
    found: dict[str, Any] = {"answers": {}, "interrupted": {}}
    for n, owner in enumerate(("alice@example.com", "bob", "alice@example.com")):
        chat = h.chat(db, owner=owner, agent_id="planner")
        run = h.answered(db, chat, f"question {n}", f"answer {n}", owner=owner,
                         when=h.at_seconds(10 * n))
        found["answers"].setdefault(owner, []).append(run.answer_id)
        found.setdefault("runs", []).append(run.run_id)
    for n, executor in enumerate(("gpu box/1", "worker-9", "gpu box/1")):
        chat = h.chat(db, owner="bob", agent_id="searcher")
        run = h.ask(db, chat, "q", owner="bob", when=h.at_seconds(100 + n))
        h.start(db, run.run_id, h.at_seconds(101 + n), executor)
        found["interrupted"].setdefault(executor, []).extend(
            h.executor_gone(db, executor, h.at_seconds(102 + n), "executor_shutdown"))
    with db.write() as s:
        for actor in ("ops@example.com", "cli:root", "ops@example.com"):
            record(s, Actor(actor, "admin"), "token.created", "token", f"tok-{actor}")
    return found


@pytest.fixture
def site(db, ledger):
    app = make_app(db)
    keys = tokens(db)
    yield {"app": app, "page": logged_in(app, keys["viewer"]), "http": FlaskHttp(app.test_client()),
           "viewer": keys["viewer"]}
    app.extensions["agentledger"].close()


# --- posting any callback as the browser would, with any value -------------------------------

def _concrete(component_id: str) -> Any:
    """A declared id as the browser sends it: a pattern id's MATCH becomes one page's log."""
    if not component_id.startswith("{"):
        return component_id
    return {k: ("run" if v == ["MATCH"] else v) for k, v in json.loads(component_id).items()}


def _prop_id(component: Any, prop: str) -> str:
    if isinstance(component, dict):
        component = json.dumps(component, sort_keys=True, separators=(",", ":"))
    return f"{component}.{prop}"


def _post(client, body: dict):
    return client.post("/_dash-update-component", headers=csrf_headers(client), json=body)


def _body(key: str, declared: dict, values: dict[str, Any], changed: list[str]) -> dict:
    outputs = declared["output"]
    several = isinstance(outputs, list)
    sent_outputs = [{"id": _concrete(o.component_id_str()), "property": o.component_property}
                    for o in (outputs if several else [outputs])]

    def deps(kind):
        return [{"id": _concrete(d["id"]), "property": d["property"],
                 "value": values.get(f"{d['id']}.{d['property']}")} for d in declared[kind]]

    return {"output": key, "outputs": sent_outputs if several else sent_outputs[0],
            "inputs": deps("inputs"), "state": deps("state"), "changedPropIds": changed}


def _base_values(ledger) -> dict[str, Any]:
    """Values a page really holds, so each hostile value replaces one of a working request:
    custom dates (the window picker's deepest path), a fresh pager, real ids."""
    values: dict[str, Any] = {
        "_pages_location.pathname": "/runs", "_pages_location.search": "",
        "run-id.data": ledger["runs"][0], "message-id.data": ledger["answers"]["bob"][0],
        '{"log":["MATCH"],"type":"event-log-state"}.data': {"run_id": ledger["runs"][0],
                                                           "after": 0},
    }
    for page in ("overview", "messages", "runs", "timeline", "interrupted", "agents"):
        values[f"{page}-window.value"] = "custom"
        values[f"{page}-dates.start_date"] = "2000-01-01"
        values[f"{page}-dates.end_date"] = "2100-12-31"
    for page in ("messages", "runs", "interrupted", "audit"):
        values[f"{page}-pager.data"] = {"cursors": [None], "page": 0, "next": None}
    return values


def _acceptable(reply) -> str | None:
    """None when the reply is one a browser can live with, else what is wrong with it."""
    if reply.status_code in (200, 204):
        return None
    if reply.status_code == 400:
        body = reply.get_json(silent=True)
        if isinstance(body, dict) and body.get("error", {}).get("code") == "invalid_request":
            return None
    return f"{reply.status_code} {reply.get_data()[:160]!r}"


@pytest.mark.slow  # thousands of requests: every dependency × every hostile value
def test_every_callback_answers_any_json_value_without_a_500(site, ledger):
    client = site["page"]
    callback_map = site["app"].extensions["agentledger_dash"].callback_map
    base = _base_values(ledger)
    failures: dict[str, list[str]] = {}
    posted = 0
    for key, declared in callback_map.items():
        inputs = [f"{d['id']}.{d['property']}" for d in declared["inputs"]]
        triggers = [_prop_id(_concrete(d["id"]), d["property"]) for d in declared["inputs"]]
        # A state is read whichever input fired: the first one, and every button.
        state_triggers = [triggers[0]] + [t for t in triggers[1:] if t.endswith(".n_clicks")]
        for kind in ("inputs", "state"):
            for dependency in declared[kind]:
                name = f"{dependency['id']}.{dependency['property']}"
                changes = ([[triggers[inputs.index(name)]]] if kind == "inputs"
                           else [[t] for t in state_triggers])
                for value in HOSTILE:
                    for changed in changes:
                        body = _body(key, declared, {**base, name: value}, changed)
                        problem = _acceptable(_post(client, body))
                        posted += 1
                        if problem:
                            failures.setdefault(name, []).append(
                                f"{value!r:.30} ({changed[0]}): {problem}")
    assert posted > 1000
    assert not failures, "\n".join(f"{name}: {len(found)} × {found[0]}; values: "
                                   + ", ".join(f.split(" (")[0] for f in found)
                                   for name, found in failures.items())


# Every filter name the pages read from their URL, and query values no page writes.
URL_NAMES = ("q", "session", "owner", "agent", "window", "since", "until", "status", "root",
             "roots", "limit", "align", "reason", "executor", "seen", "risk", "a", "b", "action",
             "actor", "run_id", "message_id")
URL_VALUES = ("garbage", "9999-12-31", "0001-01-01", "10000-01-01", "-1", "1" + "0" * 30, "%00",
              "%ED%A0%80", "x" * 5000, "", "custom")
PAGES = ("/", "/messages", "/runs", "/timeline", "/interrupted", "/leases", "/agents", "/audit",
         "/runs/run_missing", "/messages/msg_missing", "/nowhere")


def _route(client, pathname: Any, search: Any):
    return _post(client, {
        "output": ".._pages_content.children..._pages_store.data..",
        "outputs": [{"id": "_pages_content", "property": "children"},
                    {"id": "_pages_store", "property": "data"}],
        "inputs": [{"id": "_pages_location", "property": "pathname", "value": pathname},
                   {"id": "_pages_location", "property": "search", "value": search}],
        "state": [], "changedPropIds": ["_pages_location.pathname"]})


@pytest.mark.slow  # every page × every filter × every hostile value
def test_every_page_opens_on_any_url(site):
    client = site["page"]
    failures = []
    for path in PAGES:
        for name in URL_NAMES:
            for value in URL_VALUES:
                # One value, the value twice (the layout then gets a list), and a custom window.
                for search in (f"?{name}={value}", f"?{name}={value}&{name}=x",
                               f"?window=custom&{name}={value}"):
                    reply = _route(client, path, search)
                    if reply.status_code != 200:
                        failures.append((path, search[:40], reply.status_code))
    assert not failures, failures[:20]
    # A location the browser never has is the request's mistake.
    for pathname, search in (("runs", ""), (None, ""), (["/runs"], ""), ("/runs", 5),
                             ("/runs", ["?q=x"])):
        reply = _route(client, pathname, search)
        assert reply.status_code == 400, (pathname, search, reply.status_code)
        assert reply.get_json()["error"]["code"] == "invalid_request"


# --- a page's callback with some values, the others as the page holds them -------------------

def _page(site, first_output: str, values: dict[str, Any], changed: str | None = None):
    """POST the callback whose outputs start with ``first_output``; unnamed dependencies are
    None, windows ``all`` and pagers fresh unless ``values`` says otherwise."""
    callback_map = site["app"].extensions["agentledger_dash"].callback_map
    [key] = [k for k in callback_map if k.strip(".").startswith(first_output)]
    declared = callback_map[key]
    base = {f"{p}-window.value": "all" for p in ("overview", "messages", "runs", "timeline",
                                                  "interrupted", "agents")}
    base |= {f"{p}-pager.data": {"cursors": [None], "page": 0, "next": None}
             for p in ("messages", "runs", "interrupted", "audit")}
    first_input = f"{declared['inputs'][0]['id']}.{declared['inputs'][0]['property']}"
    return _post(site["page"], _body(key, declared, base | values, [changed or first_input]))


def _ok(reply) -> dict:
    assert reply.status_code == 200, reply.get_data()[:300]
    return reply.get_json()["response"]


def _twin(site, href: str) -> list[dict]:
    reply = site["http"].request("GET", href, token=site["viewer"])
    assert reply.status == 200, (href, reply.text[:300])
    return reply.json()["items"]


# --- 1a: custom dates far in the future or the past ---------------------------------------------

@pytest.mark.parametrize("since, until, window", [
    (None, "9999-12-31", {"window": "all"}),  # the reviewer's /runs?window=custom&until=9999-12-31
    ("0001-01-01", "9999-12-31", {"window": "all"}),
    ("2000-01-01", "9999-12-31", {"created_after": "2000-01-01T00:00:00Z"}),
    ("0001-01-01", "2100-01-01", {"created_before": "2100-01-02T00:00:00Z"}),
    # Windows that hold nothing, bounded where a twin still takes the bound.
    ("9999-12-31", None, {"created_after": "9000-12-31T00:00:00Z"}),
    (None, "0001-01-01", {"created_before": "1900-01-01T00:00:00Z"}),
])
def test_custom_dates_far_out_are_read_and_the_json_link_returns_what_the_page_shows(
        site, ledger, since, until, window):
    def custom(page):
        return {f"{page}-window.value": "custom", f"{page}-dates.start_date": since,
                f"{page}-dates.end_date": until}

    everything = "9999-12-31" != since and until != "0001-01-01"
    # /messages: every answer or none, and its JSON link returns the same.
    shown = _ok(_page(site, "messages-grid", custom("messages")))
    ids = [r["id"] for r in shown["messages-grid"]["rowData"]]
    assert len(ids) == (3 if everything else 0)
    href = shown["messages-json"]["href"]
    assert href == "/api/messages?" + urlencode({**window, "limit": 50}, safe=":")
    assert [i["id"] for i in _twin(site, href)] == ids
    assert shown["messages-url"]["search"] == "?" + urlencode(
        {k: v for k, v in (("window", "custom"), ("since", since), ("until", until)) if v})
    # /runs: its twin takes the bounds only (no preset), as the page read them.
    shown = _ok(_page(site, "runs-grid", custom("runs")))
    ids = [r["run"] for r in shown["runs-grid"]["rowData"]]
    assert len(ids) == (6 if everything else 0)
    bounds = {k: v for k, v in window.items() if k != "window"}
    href = shown["runs-json"]["href"]
    assert href == "/api/agent-runs?" + urlencode({**bounds, "limit": 50}, safe=":")
    assert [f"[{i['id']}](/runs/{i['id']})" for i in _twin(site, href)] == ids
    # /interrupted: both callbacks, and the twin's bounds are interrupted_after/_before.
    trend = _ok(_page(site, "interrupted-kpis", custom("interrupted")))
    listing = _ok(_page(site, "interrupted-grid", custom("interrupted")))
    ids = [r["run"] for r in listing["interrupted-grid"]["rowData"]]
    assert len(ids) == (3 if everything else 0)
    href = trend["interrupted-json"]["href"]
    assert href == "/api/interrupted-runs?" + urlencode(
        {k.replace("created", "interrupted"): v for k, v in window.items()} | {"limit": 50},
        safe=":")
    assert [f"[{i['run_id']}](/runs/{i['run_id']})" for i in _twin(site, href)] == ids
    # The other pages with a window draw, and their links are ones the twins take.
    for page in ("overview-kpis", "timeline-chart", "agents-all"):
        shown = _ok(_page(site, page, custom(page.split("-")[0])))
        twin = shown[page.split("-")[0] + "-json"]["href"]
        assert site["http"].request("GET", twin, token=site["viewer"]).status == 200, twin


# --- 1b: a pager sent back as anything -------------------------------------------------------

# Each paged listing, and a field of its rows that tells them apart.
PAGED = {"messages": "id", "runs": "run", "interrupted": "run", "audit": "actor"}
TAMPERED = ("garbage", None, [], {"cursors": [None], "page": 5, "next": "x"}, {"page": "1"},
            {"next": {"a": 1}}, {"cursors": [None], "page": True, "next": "x"},
            {"cursors": [None], "page": -1, "next": None}, {"cursors": "ab", "page": 0},
            {"cursors": [None, 5], "page": 1, "next": None},
            {"cursors": ["x"], "page": 0, "next": None}, {"cursors": [], "page": 0})


@pytest.mark.parametrize("page", sorted(PAGED))
def test_a_pager_that_is_not_well_formed_starts_again_at_the_first_page(site, page):
    field = PAGED[page]
    first = _ok(_page(site, f"{page}-grid", {}))
    rows = [r[field] for r in first[f"{page}-grid"]["rowData"]]
    assert rows
    for pager in TAMPERED:
        for button in ("next", "prev"):
            shown = _ok(_page(site, f"{page}-grid", {f"{page}-pager.data": pager,
                                                     f"{page}-{button}.n_clicks": 1},
                              changed=f"{page}-{button}.n_clicks"))
            assert [r[field] for r in shown[f"{page}-grid"]["rowData"]] == rows, (pager, button)
            assert shown[f"{page}-pager"]["data"] == {"cursors": [None], "page": 0,
                                                      "next": None}, (pager, button)
            assert shown[f"{page}-page-label"]["children"] == f"rows 1–{len(rows)}"
    # A well-formed pager whose cursor this server never made: what its twin answers, a 400.
    forged = _page(site, f"{page}-grid", {
        f"{page}-pager.data": {"cursors": [None], "page": 0, "next": "bm90IGEgY3Vyc29y"},
        f"{page}-next.n_clicks": 1}, changed=f"{page}-next.n_clicks")
    assert forged.status_code == 400
    assert forged.get_json()["error"]["code"] == "invalid_request"


# --- 1c: a chart click and an agent that are not what the page sent ----------------------------

def _click(site, click):
    return _page(site, "timeline-nav", {"timeline-chart.clickData": click},
                 changed="timeline-chart.clickData")


def test_only_a_click_on_a_run_bar_opens_a_run(site, ledger):
    run_id = ledger["runs"][0]
    opened = _ok(_click(site, {"points": [{"customdata": [run_id, "succeeded", 4.0]}]}))
    assert opened["timeline-nav"]["pathname"] == f"/runs/{run_id}"
    for click in ("x", 5, ["x"], {"points": "x"}, {"points": []}, {"points": ["x"]},
                  {"points": [{"customdata": "x"}]}, {"points": [{"customdata": []}]},
                  {"points": [{"customdata": [{"a": 1}]}]}, {"points": [{"customdata": [7]}]},
                  {"points": [{"customdata": ["../../logout"]}]},
                  {"points": [{"customdata": ["run_x?next=/evil"]}]}):
        assert _ok(_click(site, click)) == {}, click  # no_update: nowhere to go


@pytest.mark.parametrize("sent", [["x"], {"a": 1}, 10**30, True, "no such agent", "x" * 64])
def test_an_agent_value_that_is_no_agent_id_opens_the_default_agent(site, sent):
    shown = _ok(_page(site, "agents-agent.options", {"agents-agent.value": sent},
                      changed="agents-agent.value"))
    # The agent with versions to compare, as when no agent is picked.
    assert shown["agents-agent"]["value"] == "planner"
    assert [o["value"] for o in shown["agents-a"]["options"]] == ["1", "2"]
    assert (shown["agents-a"]["value"], shown["agents-b"]["value"]) == ("1", "2")
    detail = _ok(_page(site, "agents-all", {"agents-agent.value": sent}))
    assert "Pick an agent" in texts(detail["agents-detail"]["children"])


# --- 2: free-text filters are applied as typed ----------------------------------------------------

def _layout_value(site, path: str, search: str, component_id: str):
    """The value the page's layout opens ``component_id`` on, for the URL ``path + search``."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            props = node.get("props", {})
            if props.get("id") == component_id:
                found.append(props.get("value"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(_ok(_route(site["page"], path, search)))
    [value] = found
    return value


def test_the_owner_filter_takes_any_owner(site, ledger):
    owner = "alice@example.com"
    shown = _ok(_page(site, "messages-grid", {"messages-owner.value": owner},
                      changed="messages-owner.value"))
    ids = [r["id"] for r in shown["messages-grid"]["rowData"]]
    assert sorted(ids) == sorted(ledger["answers"][owner])
    assert {r["owner_id"] for r in shown["messages-grid"]["rowData"]} == {owner}
    assert shown["messages-url"]["search"] == "?owner=alice%40example.com"
    href = shown["messages-json"]["href"]
    assert href == "/api/messages?owner_id=alice%40example.com&window=all&limit=50"
    assert [i["id"] for i in _twin(site, href)] == ids
    # Opened from that URL, the page shows the filter it applies.
    assert _layout_value(site, "/messages", "?" + urlencode({"owner": owner}),
                         "messages-owner") == owner


def test_the_executor_filter_takes_any_executor_instance_id(site, ledger):
    executor = "gpu box/1"
    values = {"interrupted-executor.value": executor}
    listing = _ok(_page(site, "interrupted-grid", values, changed="interrupted-executor.value"))
    rows = listing["interrupted-grid"]["rowData"]
    assert sorted(r["run"] for r in rows) == sorted(
        f"[{r}](/runs/{r})" for r in ledger["interrupted"][executor])
    assert {r["executor_instance_id"] for r in rows} == {executor}
    trend = _ok(_page(site, "interrupted-kpis", values, changed="interrupted-executor.value"))
    assert texts(trend["interrupted-kpis"]["children"])[:2] == ["Interrupted", "2"]
    assert trend["interrupted-url"]["search"] == "?executor=gpu+box%2F1&window=all"
    href = trend["interrupted-json"]["href"]
    assert href == "/api/interrupted-runs?executor_instance_id=gpu+box%2F1&window=all&limit=50"
    assert [f"[{i['run_id']}](/runs/{i['run_id']})" for i in _twin(site, href)] == [
        r["run"] for r in rows]
    assert _layout_value(site, "/interrupted", "?" + urlencode({"executor": executor}),
                         "interrupted-executor") == executor


def test_the_actor_filter_takes_any_actor(site):
    actor = "ops@example.com"
    shown = _ok(_page(site, "audit-grid", {"audit-actor.value": actor},
                      changed="audit-actor.value"))
    rows = shown["audit-grid"]["rowData"]
    assert [r["actor"] for r in rows] == [actor, actor]
    assert shown["audit-url"]["search"] == "?actor=ops%40example.com"
    href = shown["audit-json"]["href"]
    assert href == "/api/admin-actions?actor=ops%40example.com&limit=50"
    assert [i["actor"] for i in _twin(site, href)] == [actor, actor]
    assert _layout_value(site, "/audit", "?" + urlencode({"actor": actor}), "audit-actor") == actor


@pytest.mark.parametrize("name", ["session", "root"])
def test_a_session_or_root_filter_that_is_no_id_matches_nothing(site, name):
    typed = "sess 01 / copied, with a comma"
    shown = _ok(_page(site, "runs-grid", {f"runs-{name}.value": typed},
                      changed=f"runs-{name}.value"))
    assert shown["runs-grid"]["rowData"] == []  # not every run, as if there were no filter
    href = shown["runs-json"]["href"]
    twin_name = {"session": "session_id", "root": "root_run_id"}[name]
    assert href == "/api/agent-runs?" + urlencode({twin_name: typed, "limit": 50})
    assert _twin(site, href) == []
    assert _layout_value(site, "/runs", "?" + urlencode({name: typed}), f"runs-{name}") == typed
    # Longer than any id the twin takes: cut where the twin's bound is, in the page as in its link.
    long = "sess_" + "x" * 60
    assert _layout_value(site, "/runs", f"?{name}={long}", f"runs-{name}") == long[:40]
    shown = _ok(_page(site, "runs-grid", {f"runs-{name}.value": long},
                      changed=f"runs-{name}.value"))
    assert shown["runs-json"]["href"] == f"/api/agent-runs?{twin_name}={long[:40]}&limit=50"
    assert shown["runs-grid"]["rowData"] == [] == _twin(site, shown["runs-json"]["href"])


def _left_out_note(page) -> str | None:
    """The text of a layout's note on the link's values it could not use, if it has one."""
    found = [c for c in page._traverse() if getattr(c, "id", None) == "link-left-out"]
    return found[0].children if found else None


@pytest.mark.parametrize(("page", "query", "named"), [
    ("runs", {"status": "bogus", "window": "3d"}, "status “bogus”, window “3d” are not values"),
    ("runs", {"window": "custom", "since": "2026-02-30", "until": "2026-03-01"},
     "since “2026-02-30” is not a value"),
    ("timeline", {"roots": "some", "limit": "7", "align": "left", "status": "running"},
     "roots “some”, limit “7”, align “left” are not values"),
    ("messages", {"window": "yesterday"}, "window “yesterday” is not a value"),
    ("interrupted", {"reason": "crashed"}, "reason “crashed” is not a value"),
    ("overview", {"window": "1y"}, "window “1y” is not a value"),
    ("agents", {"a": "latest", "b": "2"}, "a “latest” is not a value"),
    ("leases", {"seen": "0", "risk": "soon"}, "seen “0”, risk “soon” are not values"),
    ("audit", {"action": "token.stolen"}, "action “token.stolen” is not a value"),
])
def test_a_link_value_a_page_cannot_use_is_named_not_dropped_in_silence(site, page, query,
                                                                         named):
    """``/runs?status=bogus`` would show every run with its filter on "any", and the address
    bar would lose the value: the page says which of its link's values it left out."""
    import importlib

    module = importlib.import_module(f"dashboards.pages.{page}")
    note = _left_out_note(module.layout(**query))
    assert note is not None and named in note, note
    assert note.endswith("this page takes: the filters below show what it shows instead.")


@pytest.mark.parametrize(("page", "query"), [
    ("runs", {"status": "failed", "window": "30d", "session": "anything typed", "root": "x"}),
    ("runs", {"window": "custom", "since": "2026-02-01", "until": "2026-03-01"}),
    ("timeline", {"roots": "roots", "limit": "1000", "align": "clock", "window": "24h"}),
    ("messages", {"q": "refund", "owner": "bob", "window": "all"}),
    ("interrupted", {"reason": "lease_expired", "executor": "gpu box/1"}),
    ("overview", {}),
    ("agents", {"a": "1", "b": "2", "agent": "no-such-agent"}),
    ("leases", {"seen": "1440", "risk": "1"}),
    ("audit", {"action": "token.created", "actor": "anyone"}),
    ("runs", {"status": "", "window": "  "}),
])
def test_a_link_whose_values_the_page_uses_gets_no_note(site, page, query):
    import importlib

    module = importlib.import_module(f"dashboards.pages.{page}")
    assert _left_out_note(module.layout(**query)) is None
