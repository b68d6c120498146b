"""Dash callbacks over HTTP, as the browser calls them: each page's callback reads the right
facts through ``queries`` and renders agent output as text, never as markup."""

from __future__ import annotations

import json

import pytest
from support import history as h
from support.dashboards import call, csrf_headers, logged_in, make_app, texts, tokens

HOSTILE = "<script>alert('x')</script><b>bold</b> [link](javascript:alert(1))"


@pytest.fixture
def ledger(db):
    h.agent(db, "planner")
    h.agent(db, "searcher")
    chat = h.chat(db, owner="alice", agent_id="planner", title="Q3 numbers")
    root = h.ask(db, chat, "plan it", owner="alice", when=h.at_seconds(0))
    h.start(db, root.run_id, h.at_seconds(1))
    ok = h.delegate(db, root.run_id, "searcher", h.at_seconds(2))
    bad = h.delegate(db, root.run_id, "searcher", h.at_seconds(3))
    h.start(db, ok, h.at_seconds(4), "worker-2")
    h.complete(db, ok, h.at_seconds(5), "found it", "worker-2")
    h.start(db, bad, h.at_seconds(6), "worker-3")
    h.fail(db, bad, h.at_seconds(7), "worker-3")
    answer = h.complete(db, root.run_id, h.at_seconds(9), HOSTILE)
    other = h.chat(db, owner="bob", agent_id="searcher")
    decoy = h.answered(db, other, "q", "nothing to see", owner="bob", when=h.at_seconds(20))
    return {"root": root.run_id, "ok": ok, "bad": bad, "answer": answer, "decoy": decoy,
            "question": root.message_id}


@pytest.fixture
def client(db, ledger):
    app = make_app(db)
    return logged_in(app, tokens(db)["viewer"])


def test_run_tree_callback_draws_every_node_and_marks_the_failed_one(client, ledger):
    response = call(client, [("run-header", "children"), ("run-tree", "elements"),
                             ("run-tree", "layout")],
                    [("run-id", "data", ledger["ok"])], changed=["run-id.data"])
    assert "3 runs in this tree" in texts(response["run-header"]["children"])
    elements = response["run-tree"]["elements"]
    nodes = {e["data"]["id"]: e for e in elements if "source" not in e["data"]}
    edges = {(e["data"]["source"], e["data"]["target"]) for e in elements if "source" in e["data"]}
    assert set(nodes) == {ledger["root"], ledger["ok"], ledger["bad"]}
    assert edges == {(ledger["root"], ledger["ok"]), (ledger["root"], ledger["bad"])}
    assert "failed" in nodes[ledger["bad"]]["classes"].split()
    assert "focus" in nodes[ledger["ok"]]["classes"].split()
    assert response["run-tree"]["layout"]["roots"] == f"[id = '{ledger['root']}']"


def test_clicking_a_node_shows_its_events_and_snapshots(client, ledger):
    response = call(client, [("run-node", "children")],
                    [("run-tree", "tapNodeData", {"id": ledger["bad"]}),
                     ("run-id", "data", ledger["root"])], changed=["run-tree.tapNodeData"])
    shown = texts(response["run-node"]["children"])
    assert ledger["bad"] in shown and "failed" in shown
    assert {"run.queued", "run.started", "run.failed"} <= set(shown)
    assert "worker-3" in shown
    labels = json.dumps(response)
    assert "Agent snapshot" in labels and "Context pack" in labels


def test_provenance_renders_the_answer_as_plain_text(client, ledger):
    response = call(client, [("message-body", "children")],
                    [("message-id", "data", ledger["answer"])], changed=["message-id.data"])
    body = response["message-body"]["children"]
    raw = json.dumps(body)
    assert "Markdown" not in raw and "dangerously_allow_html" not in raw
    shown = texts(body)
    assert HOSTILE in shown  # the exact characters, as the text of a <pre>
    assert "Planner" in shown and ledger["root"] in shown and "Q3 numbers · " in "".join(shown)


@pytest.mark.parametrize("which, expected", [("question", "This is a user's message"),
                                             (None, "No such answer")])
def test_provenance_of_a_question_or_of_nothing_explains_itself(client, ledger, which, expected):
    message_id = ledger[which] if which else "msg_does_not_exist"
    response = call(client, [("message-body", "children")], [("message-id", "data", message_id)],
                    changed=["message-id.data"])
    assert expected in texts(response["message-body"]["children"])


def test_message_search_finds_by_text_and_pushes_the_filters_to_the_url(client, ledger):
    outputs = [("messages-grid", "rowData"), ("messages-grid", "style"),
               ("messages-empty", "children"), ("messages-empty", "style"),
               ("messages-pager", "data"), ("messages-prev", "disabled"),
               ("messages-next", "disabled"), ("messages-page-label", "children"),
               ("messages-url", "search"), ("messages-json", "href"),
               ("messages-dates-col", "style")]
    inputs = [("messages-q", "value", "SCRIPT"), ("messages-agent", "value", None),
              ("messages-owner", "value", None), ("messages-session", "value", None),
              ("messages-window", "value", "all"), ("messages-dates", "start_date", None),
              ("messages-dates", "end_date", None), ("messages-prev", "n_clicks", None),
              ("messages-next", "n_clicks", None)]
    state = [("messages-pager", "data", None), ("messages-url", "search", "")]
    response = call(client, outputs, inputs, state, changed=["messages-q.value"])
    rows = response["messages-grid"]["rowData"]
    assert [r["id"] for r in rows] == [ledger["answer"]]
    assert rows[0]["content_preview"] == HOSTILE
    assert rows[0]["message"] == f"[{ledger['answer']}](/messages/{ledger['answer']})"
    assert response["messages-url"]["search"] == "?q=SCRIPT"
    # The JSON link: the same filters in the twin's names, the window stated.
    assert response["messages-json"]["href"] == "/api/messages?q=SCRIPT&window=all&limit=50"
    assert response["messages-empty"]["style"] == {"display": "none"}
    nothing = call(client, outputs, [("messages-q", "value", "zzz")] + inputs[1:], state,
                   changed=["messages-q.value"])
    assert nothing["messages-grid"]["rowData"] == []
    assert nothing["messages-grid"]["style"] == {"display": "none"}
    assert "No answers match" in texts(nothing["messages-empty"]["children"])


def test_run_explorer_pages_with_cursors(client, ledger, monkeypatch):
    outputs = [("runs-grid", "rowData"), ("runs-grid", "style"), ("runs-empty", "children"),
               ("runs-empty", "style"), ("runs-pager", "data"), ("runs-prev", "disabled"),
               ("runs-next", "disabled"), ("runs-page-label", "children"),
               ("runs-url", "search"), ("runs-json", "href"),
               ("runs-dates-col", "style")]

    def inputs(prev=None, next_=None):
        return [("runs-status", "value", "any"), ("runs-agent", "value", "searcher"),
                ("runs-session", "value", None), ("runs-root", "value", None),
                ("runs-window", "value", "all"), ("runs-dates", "start_date", None),
                ("runs-dates", "end_date", None), ("runs-prev", "n_clicks", prev),
                ("runs-next", "n_clicks", next_)]

    first = call(client, outputs, inputs(), [("runs-pager", "data", None), ("runs-url", "search", "")])
    assert len(first["runs-grid"]["rowData"]) == 3  # two children + bob's decoy run
    assert first["runs-next"]["disabled"] is True and first["runs-prev"]["disabled"] is True
    assert first["runs-json"]["href"] == "/api/agent-runs?agent_id=searcher&limit=50"  # all time
    statuses = sorted(r["status"] for r in first["runs-grid"]["rowData"])
    assert statuses == ["failed", "succeeded", "succeeded"]
    # A page of one row, then the next one.
    pager = {"cursors": [None], "page": 0, "next": None}
    from dashboards import components

    monkeypatch.setattr(components, "PAGE_SIZE", 1)
    one = call(client, outputs, inputs(), [("runs-pager", "data", pager), ("runs-url", "search", "")])
    assert len(one["runs-grid"]["rowData"]) == 1 and one["runs-next"]["disabled"] is False
    two = call(client, outputs, inputs(next_=1),
               [("runs-pager", "data", one["runs-pager"]["data"]), ("runs-url", "search", "")],
               changed=["runs-next.n_clicks"])
    assert two["runs-pager"]["data"]["page"] == 1 and two["runs-prev"]["disabled"] is False
    assert two["runs-grid"]["rowData"] != one["runs-grid"]["rowData"]
    assert two["runs-page-label"]["children"] == "rows 2–2 · more below"
    back = call(client, outputs, inputs(prev=1, next_=1),
                [("runs-pager", "data", two["runs-pager"]["data"]), ("runs-url", "search", "")],
                changed=["runs-prev.n_clicks"])
    assert back["runs-grid"]["rowData"] == one["runs-grid"]["rowData"]


def test_lease_page_refreshes_from_the_database_clock(client, db, ledger):
    from datetime import UTC, datetime, timedelta

    chat = h.chat(db, owner="carol", agent_id="planner")
    live = h.ask(db, chat, "q", owner="carol", when=datetime.now(UTC) - timedelta(seconds=2))
    h.start(db, live.run_id, datetime.now(UTC) - timedelta(seconds=1), "exec-live", lease_seconds=8)
    outputs = [("leases-kpis", "children"), ("leases-clock", "children"),
               ("leases-executors", "rowData"), ("leases-executors", "style"),
               ("leases-executors-empty", "children"), ("leases-executors-empty", "style"),
               ("leases-chart", "figure"), ("leases-leases", "rowData"), ("leases-leases", "style"),
               ("leases-leases-empty", "children"), ("leases-leases-empty", "style"),
               ("leases-leases-note", "children"),
               ("leases-url", "search"), ("leases-json", "href")]
    response = call(client, outputs, [("leases-tick", "n_intervals", 3), ("leases-seen", "value", 15),
                                      ("leases-risk", "value", 10)],
                    [("leases-url", "search", "")], changed=["leases-tick.n_intervals"])
    [lease] = response["leases-leases"]["rowData"]
    assert lease["at_risk"] is True and lease["executor_instance_id"] == "exec-live"
    assert [e["executor_instance_id"] for e in response["leases-executors"]["rowData"]] == ["exec-live"]
    assert "database clock" in response["leases-clock"]["children"]
    assert response["leases-json"]["href"] == (
        "/api/leases?seen_minutes=15&at_risk_seconds=10&limit=200")
    assert "search" not in response.get("leases-url", {})  # a clock tick is not a filter change


# --- /agents: counts and rates by terminal status ---------------------------------------------

def test_agents_page_shows_each_terminal_status_as_count_and_rate(client, ledger):
    outputs = [("agents-all", "rowData"), ("agents-note", "children"), ("agents-detail", "children"),
               ("agents-url", "search"), ("agents-json", "href"), ("agents-dates-col", "style")]
    inputs = [("agents-window", "value", "all"), ("agents-dates", "start_date", None),
              ("agents-dates", "end_date", None), ("agents-agent", "value", "searcher"),
              ("agents-a", "value", "1"), ("agents-b", "value", "1")]
    response = call(client, outputs, inputs, [("agents-url", "search", "")])
    # Both grids are one query of the window: the JSON link is the window, not the agent.
    assert response["agents-json"]["href"] == "/api/agent-outcomes?window=all&limit=500"
    # searcher: the finished child, the failed child and bob's answered decoy
    [searcher] = [r for r in response["agents-all"]["rowData"] if r["label"].endswith("(searcher)")]
    assert (searcher["succeeded_count"], searcher["succeeded"]) == (2, "66.7%")
    assert (searcher["failed_count"], searcher["failed"]) == (1, "33.3%")
    assert (searcher["interrupted_count"], searcher["cancelled_count"]) == (0, 0)
    detail = response["agents-detail"]["children"]
    shown = texts(detail)
    # The versions side by side: each status's count beside its rate, for both columns.
    row = shown.index("Succeeded")
    assert shown[row:row + 3] == ["Succeeded", "2 · 66.7%", "2 · 66.7%"]
    row = shown.index("Failed")
    assert shown[row:row + 3] == ["Failed", "1 · 33.3%", "1 · 33.3%"]
    # The per-version grid carries the counts too.
    raw = json.dumps(detail)
    assert '"succeeded_count": 2' in raw and '"failed_count": 1' in raw


# --- event logs of long runs: every event reachable, the last page one click away ---------------

LOG_PARTS = (("table", "children"), ("state", "data"), ("label", "children"),
             ("first", "disabled"), ("prev", "disabled"), ("next", "disabled"), ("last", "disabled"))
BUTTONS = ("first", "prev", "next", "last")


@pytest.fixture
def long_run(db):
    """An answer whose run has 450 events: queued, started, 447 deltas and run.completed."""
    h.agent(db, "talker")
    chat = h.chat(db, owner="carol", agent_id="talker", title="long answer")
    posted = h.ask(db, chat, "talk", owner="carol", when=h.at_seconds(100))
    h.start(db, posted.run_id, h.at_seconds(101))
    for first in range(0, 446, 100):
        h.events(db, posted.run_id, h.at_seconds(102), [
            ("message.delta", {"text": f"part {n} "}) for n in range(first, min(first + 100, 446))])
    answer = h.complete(db, posted.run_id, h.at_seconds(103), "the end")
    return {"run": posted.run_id, "answer": answer}


def _log_id(part: str, log: str) -> dict:
    return {"type": f"event-log-{part}", "log": log}


def _turn(client, log: str, part: str, state: dict) -> dict:
    """Click ``part`` of the page's event log, as the browser sends it (pattern ids)."""
    callback_map = client.application.extensions["agentledger_dash"].callback_map
    [output] = [key for key in callback_map if "event-log-table" in key]
    body = {
        "output": output,
        "outputs": [{"id": _log_id(p, log), "property": prop} for p, prop in LOG_PARTS],
        "inputs": [{"id": _log_id(b, log), "property": "n_clicks", "value": 1 if b == part else None}
                   for b in BUTTONS],
        "state": [{"id": _log_id("state", log), "property": "data", "value": state}],
        "changedPropIds": [json.dumps(_log_id(part, log), sort_keys=True, separators=(",", ":"))
                           + ".n_clicks"],
    }
    reply = client.post("/_dash-update-component", headers=csrf_headers(client), json=body)
    assert reply.status_code == 200, reply.data[:500]
    found = reply.get_json()["response"]
    key = json.dumps(_log_id("table", log), sort_keys=True, separators=(",", ":"))
    assert key in found
    return {p: found[json.dumps(_log_id(p, log), sort_keys=True, separators=(",", ":"))][prop]
            for p, prop in LOG_PARTS}


def _seqs(table) -> list[int]:
    rows = table["props"]["children"][1]["props"]["children"]
    return [row["props"]["children"][0]["props"]["children"] for row in rows]


def _opened(client, log: str, long_run) -> list:
    if log == "message":
        return call(client, [("message-body", "children")],
                    [("message-id", "data", long_run["answer"])],
                    changed=["message-id.data"])["message-body"]["children"]
    return call(client, [("run-node", "children")],
                [("run-tree", "tapNodeData", None), ("run-id", "data", long_run["run"])],
                changed=["run-id.data"])["run-node"]["children"]


@pytest.mark.parametrize("log", ["message", "run"])
def test_event_log_of_a_long_run_reaches_its_terminal_event_in_one_click(client, long_run, log):
    opened = _opened(client, log, long_run)
    shown = texts(opened)
    # The page opens on the first 200 events and says which seqs of how many it shows.
    assert "Showing seq 1–200 of 450 events" in shown
    assert "run.queued" in shown and "run.completed" not in shown
    state = {"run_id": long_run["run"], "after": 0}
    assert f'"data": {json.dumps(state)}' in json.dumps(opened)

    last = _turn(client, log, "last", state)
    assert _seqs(last["table"]) == list(range(401, 451))
    assert "run.completed" in texts(last["table"])
    assert last["label"] == "Showing seq 401–450 of 450 events"
    assert (last["first"], last["prev"], last["next"], last["last"]) == (False, False, True, True)
    assert last["state"] == {"run_id": long_run["run"], "after": 400}

    earlier = _turn(client, log, "prev", last["state"])
    assert _seqs(earlier["table"]) == list(range(201, 401))
    assert earlier["label"] == "Showing seq 201–400 of 450 events"
    assert (earlier["next"], earlier["last"]) == (False, False)
    later = _turn(client, log, "next", earlier["state"])
    assert _seqs(later["table"]) == list(range(401, 451))
    first = _turn(client, log, "first", later["state"])
    assert _seqs(first["table"]) == list(range(1, 201))
    assert (first["first"], first["prev"], first["next"]) == (True, True, False)


def test_event_log_state_from_the_browser_is_not_trusted(client, long_run):
    # Off a page boundary, past the end, or not a run: still whole pages of real seqs.
    odd = _turn(client, "run", "next", {"run_id": long_run["run"], "after": 207})
    assert _seqs(odd["table"]) == list(range(401, 451))
    beyond = _turn(client, "run", "prev", {"run_id": long_run["run"], "after": 10_000})
    assert beyond["label"] == "No events here; the run has 450."
    assert _seqs(_turn(client, "run", "last", beyond["state"])["table"])[-1] == 450
    huge = _turn(client, "run", "next", {"run_id": long_run["run"], "after": 10**30})
    assert huge["label"] == "No events here; the run has 450."
    for state in ({"run_id": "run_missing", "after": 0}, {"run_id": ["x"]}, "junk", None):
        gone = _turn(client, "run", "last", state)
        assert "No such run" in texts(gone["table"])


AGENT_FILTER_PAGES = ["runs", "messages", "timeline", "interrupted"]


def _agent_options(client, page: str, value, search=None) -> list[dict]:
    response = call(client, [(f"{page}-agent", "options")],
                    [(f"{page}-url", "pathname", f"/{page}"),
                     (f"{page}-agent", "search_value", search)],
                    [(f"{page}-agent", "value", value)],
                    changed=[f"{page}-agent.search_value" if search else f"{page}-url.pathname"])
    return response[f"{page}-agent"]["options"]


@pytest.mark.parametrize("page", AGENT_FILTER_PAGES)
def test_an_agent_filter_keeps_its_agent_however_many_agents_there_are(client, db, page):
    # A drop-down drops a value missing from its options: the filter of a link on an agent past
    # the first choices, or on no agent, used to be cleared and the page showed every agent.
    from dashboards.components import AGENT_CHOICES

    for n in range(AGENT_CHOICES + 5):
        h.agent(db, f"zz-filler-{n:03d}", names=(f"Filler {n}",))
    last = f"zz-filler-{AGENT_CHOICES + 4:03d}"
    opened = _agent_options(client, page, None)
    assert len(opened) == AGENT_CHOICES and last not in {o["value"] for o in opened}
    kept = _agent_options(client, page, last)
    assert {"label": f"Filler {AGENT_CHOICES + 4} ({last})", "value": last} in kept
    unknown = _agent_options(client, page, "no-such-agent")
    assert unknown[0] == {"label": "no-such-agent (no such agent)", "value": "no-such-agent"}
    # Typing finds an agent by id or by name, in any case.
    assert [o["value"] for o in _agent_options(client, page, None, search="FILLER 104")] == [last]
    assert [o["value"] for o in _agent_options(client, page, None, search="r-10")] == [
        f"zz-filler-{n}" for n in range(100, AGENT_CHOICES + 5)]
    for hostile in ["%", "_", "\x00", "x" * 10_000, 5, ["a"]]:
        assert isinstance(_agent_options(client, page, None, search=hostile), list)
    assert _agent_options(client, page, None, search="%") == []


def test_the_agents_page_narrows_its_choices_as_the_user_types_and_keeps_what_is_shown(client):
    outputs = [("agents-agent", "options"), ("agents-agent", "value"), ("agents-a", "options"),
               ("agents-a", "value"), ("agents-b", "options"), ("agents-b", "value")]
    inputs = [("agents-agent", "value", "planner"), ("agents-agent", "search_value", "sear")]
    response = call(client, outputs, inputs, [("agents-a", "value", "1"), ("agents-b", "value", "1")],
                    changed=["agents-agent.search_value"])
    assert response == {"agents-agent": {"options": [
        {"label": "Planner (planner)", "value": "planner"},
        {"label": "Searcher (searcher)", "value": "searcher"}]}}
