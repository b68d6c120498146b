"""Dash callbacks over HTTP, as the browser calls them: each page's callback reads the right
facts through ``queries`` and renders agent output as text, never as markup."""

from __future__ import annotations

import json

import pytest
from support import history as h
from support.dashboards import call, logged_in, make_app, texts, tokens

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
               ("messages-url", "search"), ("messages-dates-col", "style")]
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
    assert response["messages-empty"]["style"] == {"display": "none"}
    nothing = call(client, outputs, [("messages-q", "value", "zzz")] + inputs[1:], state,
                   changed=["messages-q.value"])
    assert nothing["messages-grid"]["rowData"] == []
    assert nothing["messages-grid"]["style"] == {"display": "none"}
    assert "No answers match" in texts(nothing["messages-empty"]["children"])


def test_run_explorer_pages_with_cursors(client, ledger, monkeypatch):
    outputs = [("runs-grid", "rowData"), ("runs-grid", "style"), ("runs-empty", "children"),
               ("runs-empty", "style"), ("runs-pager", "data"), ("runs-prev", "disabled"),
               ("runs-next", "disabled"), ("runs-page-label", "children"), ("runs-url", "search"),
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
               ("leases-leases-note", "children"), ("leases-url", "search")]
    response = call(client, outputs, [("leases-tick", "n_intervals", 3), ("leases-seen", "value", 15),
                                      ("leases-risk", "value", 10)],
                    [("leases-url", "search", "")], changed=["leases-tick.n_intervals"])
    [lease] = response["leases-leases"]["rowData"]
    assert lease["at_risk"] is True and lease["executor_instance_id"] == "exec-live"
    assert [e["executor_instance_id"] for e in response["leases-executors"]["rowData"]] == ["exec-live"]
    assert "database clock" in response["leases-clock"]["children"]
    assert "search" not in response.get("leases-url", {})  # a clock tick is not a filter change
