"""Runs: detail, filtered lists, event pages, cancel, trees and provenance (Flask test client)."""

from __future__ import annotations

import time

import pytest
from support.api import (
    RUN_FIELDS,
    SSEParser,
    answer,
    append,
    assert_error,
    assert_iso_utc,
    claim_run,
    complete_run,
    create_agent,
    ledger_state,
    list_all,
    open_session,
    post_message,
    unique,
)


@pytest.fixture
def chat(api):
    return open_session(api, api.alice, title="runs")["id"]


def test_run_detail_has_every_contract_field(api, chat):
    posted, answer_id = answer(api, api.alice, api.executor, chat, "hi", texts=("he", "llo"))
    run = api.get(f"/api/agent-runs/{posted['run_id']}", api.alice).json()
    assert set(run) >= RUN_FIELDS
    assert run["status"] == "succeeded" and run["final_message_id"] == answer_id
    assert (run["agent_id"], run["agent_name"], run["agent_version"]) == ("echo", "Echo", 1)
    assert run["thread_id"].startswith("thr_") and run["session_id"] == chat
    assert run["events_url"] == f"/api/agent-runs/{run['id']}/events"
    snapshot = run["agent_execution_snapshot"]
    assert snapshot["agent_id"] == "echo" and snapshot["version"] == 1
    assert len(snapshot["content_hash"]) == 64
    assert run["context_pack_snapshot"]["items"] == []
    assert run["last_event_seq"] == 5  # queued, started, 2 deltas, completed
    assert run["error"] is None
    for key in ("created_at", "started_at", "finished_at", "lease_expires_at"):
        assert_iso_utc(run[key])
    assert run["created_at"] <= run["started_at"] <= run["finished_at"]


# ---- lists and filters -------------------------------------------------------------------------


@pytest.fixture
def fleet(api):
    """Runs in several states, agents, sessions and owners (created in a known order)."""
    create_agent(api, api.admin, "critic", name="Critic")
    s1 = open_session(api, api.alice, title="one")["id"]
    s2 = open_session(api, api.alice, "critic", title="two")["id"]
    s3 = open_session(api, api.bob, title="bob")["id"]
    runs = {}
    runs["done"] = answer(api, api.alice, api.executor, s1, "a")[0]["run_id"]
    time.sleep(0.002)
    runs["failed"] = post_message(api, api.alice, s2, "b")["run_id"]
    inst = unique("e")
    claim_run(api, api.executor, runs["failed"], inst)
    assert append(api, api.executor, runs["failed"], inst,
                  [("run.failed", {"error": {"code": "agent_error", "message": "no"}})]).status == 200
    time.sleep(0.002)
    runs["cancelled"] = post_message(api, api.alice, s1, "c", agent_id="critic")["run_id"]
    assert api.post(f"/api/agent-runs/{runs['cancelled']}/cancel", api.alice).json()["status"] == "cancelled"
    time.sleep(0.002)
    runs["queued"] = post_message(api, api.alice, s1, "d")["run_id"]
    time.sleep(0.002)
    runs["bob"] = post_message(api, api.bob, s3, "e")["run_id"]
    return {"sessions": (s1, s2, s3), "runs": runs}


def _ids(api, token, **query):
    reply = api.get("/api/agent-runs", token, query=query)
    assert reply.status == 200, reply
    return [r["id"] for r in reply.json()["items"]]


def test_run_list_filters(api, fleet):
    s1, s2, s3 = fleet["sessions"]
    r = fleet["runs"]
    newest_first = [r["bob"], r["queued"], r["cancelled"], r["failed"], r["done"]]
    assert _ids(api, api.admin) == newest_first
    assert _ids(api, api.alice) == newest_first[1:]
    assert _ids(api, api.bob) == [r["bob"]]

    assert _ids(api, api.viewer, status="succeeded") == [r["done"]]
    assert _ids(api, api.viewer, status="failed") == [r["failed"]]
    assert _ids(api, api.viewer, status="cancelled") == [r["cancelled"]]
    assert _ids(api, api.viewer, status="queued") == [r["bob"], r["queued"]]
    assert _ids(api, api.alice, status="queued") == [r["queued"]]
    assert _ids(api, api.viewer, status="running") == []
    assert _ids(api, api.viewer, agent_id="critic") == [r["cancelled"], r["failed"]]
    assert _ids(api, api.viewer, session_id=s1) == [r["queued"], r["cancelled"], r["done"]]
    assert _ids(api, api.viewer, session_id=s1, agent_id="echo") == [r["queued"], r["done"]]
    assert _ids(api, api.viewer, session_id=s1, status="succeeded") == [r["done"]]
    assert _ids(api, api.viewer, root_run_id=r["failed"]) == [r["failed"]]
    assert _ids(api, api.bob, session_id=s1) == []

    created = {k: api.get(f"/api/agent-runs/{v}", api.admin).json()["created_at"] for k, v in r.items()}
    pivot = created["cancelled"]
    assert _ids(api, api.viewer, created_after=pivot) == [r["bob"], r["queued"], r["cancelled"]]
    assert _ids(api, api.viewer, created_before=pivot) == [r["failed"], r["done"]]
    assert _ids(api, api.viewer, created_after=created["failed"],
                created_before=created["queued"]) == [r["cancelled"], r["failed"]]
    z_form = pivot.replace("+00:00", "Z")
    assert _ids(api, api.viewer, created_after=z_form) == [r["bob"], r["queued"], r["cancelled"]]
    assert _ids(api, api.viewer, created_after="2999-01-01T00:00:00+00:00") == []


def test_run_list_pages_through_every_run_exactly_once(api, fleet):
    expected = _ids(api, api.admin)
    for limit in (1, 2, 3):
        items, pages = list_all(api, api.admin, "/api/agent-runs", limit=limit)
        assert [i["id"] for i in items] == expected
        assert pages == -(-len(expected) // limit)
    s1 = fleet["sessions"][0]
    items, _ = list_all(api, api.viewer, "/api/agent-runs", limit=1, query={"session_id": s1})
    assert [i["id"] for i in items] == _ids(api, api.viewer, session_id=s1)
    for item in items:
        assert set(item) >= RUN_FIELDS


def test_agent_list_and_many_runs_page_exactly_once(api, chat):
    runs = [post_message(api, api.alice, chat, f"m{i}")["run_id"] for i in range(12)]
    items, pages = list_all(api, api.alice, "/api/agent-runs", limit=5)
    assert pages == 3 and [i["id"] for i in items] == list(reversed(runs))
    history, pages = list_all(api, api.alice, f"/api/sessions/{chat}/messages", limit=5)
    assert pages == 3 and [m["run_id"] for m in history] == runs


# ---- events as JSON pages ----------------------------------------------------------------------


def test_event_pages_with_after_seq_and_limit(api, chat):
    posted = post_message(api, api.alice, chat)
    run = posted["run_id"]
    url = posted["events_url"]
    page = api.get(url, api.alice).json()
    assert page == {"run_id": run, "events": page["events"], "next_after_seq": 1,
                    "status": "queued", "terminal": False}
    inst = unique("e")
    claim_run(api, api.executor, run, inst)
    texts = [f"t{i}" for i in range(7)]
    assert append(api, api.executor, run, inst,
                  [("message.delta", {"text": t}) for t in texts]).json()["seqs"] == list(range(3, 10))
    page = api.get(url, api.alice, query={"after_seq": 2, "limit": 3}).json()
    assert [e["seq"] for e in page["events"]] == [3, 4, 5] and page["next_after_seq"] == 5
    assert page["status"] == "running" and page["terminal"] is False
    assert [e["data"]["text"] for e in page["events"]] == ["t0", "t1", "t2"]
    for event in page["events"]:
        assert set(event) == {"seq", "type", "data", "created_at"}
        assert_iso_utc(event["created_at"])
    empty = api.get(url, api.alice, query={"after_seq": 50}).json()
    assert empty["events"] == [] and empty["next_after_seq"] == 50 and empty["terminal"] is False

    complete_run(api, api.executor, run, instance=inst, claim=False, texts=())
    collected, after = [], 0
    while True:
        page = api.get(url, api.alice, query={"after_seq": after, "limit": 4}).json()
        collected += page["events"]
        after = page["next_after_seq"]
        if page["terminal"]:
            break
        assert page["events"], "a non-terminal page with no events would loop forever"
    assert [e["seq"] for e in collected] == list(range(1, 11))
    assert collected[-1]["type"] == "run.completed" and page["status"] == "succeeded"
    # a page that stops before the terminal event is not terminal, even for a finished run
    partial = api.get(url, api.alice, query={"after_seq": 0, "limit": 9}).json()
    assert partial["status"] == "succeeded" and partial["terminal"] is False


def test_event_stream_through_the_test_client(api, chat):
    posted, _ = answer(api, api.alice, api.executor, chat, "q", texts=("x", "y"))
    url = posted["events_url"]
    stored = api.get(url, api.alice).json()["events"]
    reply = api.get(url, api.alice, headers={"Accept": "text/event-stream"})
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "text/event-stream"  # exactly, as CONTRACT §5 says
    assert reply.headers["Cache-Control"] == "no-cache" and reply.headers["X-Accel-Buffering"] == "no"
    parser = SSEParser()
    frames = parser.feed(reply.body)
    assert not parser.pending
    assert frames[0].retry is not None
    events = [f for f in frames if f.is_event]
    assert [f.json() for f in events] == stored
    assert [(f.id, f.event) for f in events] == [(str(e["seq"]), e["type"]) for e in stored]
    resumed = api.get(url, api.alice, headers={"Accept": "text/event-stream", "Last-Event-ID": "3"})
    assert [f.json()["seq"] for f in SSEParser().feed(resumed.body) if f.is_event] == [4, 5]
    after = api.get(url, api.alice, headers={"Accept": "text/event-stream"}, query={"after_seq": 4})
    assert [f.json()["seq"] for f in SSEParser().feed(after.body) if f.is_event] == [5]
    done = api.get(url, api.alice, headers={"Accept": "text/event-stream", "Last-Event-ID": "5"})
    assert done.status == 204 and done.body == b""
    assert "Content-Type" not in done.headers  # no body, so no type (Flask's text/html was)


def test_an_event_stream_leaves_no_subscription_behind(api, chat):
    """The stream subscribes to its run before its first read; whatever the answer (404, 204, a
    stream read to its end, or one closed unread), the subscription ends with the response."""
    notifier = api.app.extensions["agentledger"].notifier
    sse = {"Accept": "text/event-stream"}
    assert api.get("/api/agent-runs/run_nope/events", api.alice, headers=sse).status == 404
    assert notifier.subscribers("run_nope") == 0

    posted, _ = answer(api, api.alice, api.executor, chat, "q", texts=("x",))
    run, url = posted["run_id"], posted["events_url"]
    assert api.get(url, api.bob, headers=sse).status == 404  # another owner's run
    assert api.get(url, api.alice, headers={**sse, "Last-Event-ID": "4"}).status == 204
    assert notifier.subscribers(run) == 0
    assert [f.event for f in SSEParser().feed(api.get(url, api.alice, headers=sse).body)
            if f.is_event][-1] == "run.completed"
    assert notifier.subscribers(run) == 0

    waiting = post_message(api, api.alice, chat, "another")
    unread = api.client.get(waiting["events_url"], headers={**sse, "Authorization":
                                                            f"Bearer {api.alice}"},
                            buffered=False)
    assert unread.status_code == 200 and notifier.subscribers(waiting["run_id"]) == 1
    unread.close()
    assert notifier.subscribers(waiting["run_id"]) == 0


# ---- cancel ------------------------------------------------------------------------------------


def test_cancel_a_queued_run_is_cancelled_at_once(api, chat):
    run = post_message(api, api.alice, chat)["run_id"]
    reply = api.post(f"/api/agent-runs/{run}/cancel", api.alice)
    assert reply.status == 202 and reply.json() == {"run_id": run, "status": "cancelled"}
    events = api.get(f"/api/agent-runs/{run}/events", api.alice).json()
    assert [e["type"] for e in events["events"]] == ["run.queued", "run.cancelled"]
    assert events["events"][-1]["data"]["external_stop_confirmed"] is True
    assert events["terminal"] is True
    assert_error(api.post(f"/api/agent-runs/{run}/cancel", api.alice), 409, "run_terminal")


def test_cancel_a_running_run_goes_through_cancelling(api, chat):
    run = post_message(api, api.alice, chat)["run_id"]
    inst = unique("e")
    claim_run(api, api.executor, run, inst)
    reply = api.post(f"/api/agent-runs/{run}/cancel", api.alice)
    assert reply.status == 202 and reply.json() == {"run_id": run, "status": "cancelling"}
    state = ledger_state(api.db, run)
    again = api.post(f"/api/agent-runs/{run}/cancel", api.admin)  # repeating is harmless
    assert again.status == 202 and again.json()["status"] == "cancelling"
    assert ledger_state(api.db, run) == state
    beat = api.post(f"/api/executor/runs/{run}/heartbeat", api.executor,
                    json={"executor_instance_id": inst})
    assert beat.status == 200 and beat.json()["cancel_requested"] is True
    done = append(api, api.executor, run, inst, [("run.cancelled", {"external_stop_confirmed": True})])
    assert done.status == 200
    events = api.get(f"/api/agent-runs/{run}/events", api.alice).json()
    types = [e["type"] for e in events["events"]]
    assert types == ["run.queued", "run.started", "run.cancelling", "run.cancelled"]
    assert events["events"][2]["data"]["requested_by"] == "alice"
    assert events["status"] == "cancelled" and events["terminal"] is True
    assert_error(api.post(f"/api/agent-runs/{run}/cancel", api.alice), 409, "run_terminal")


def test_cancel_reaches_the_descendants(api, chat):
    root = post_message(api, api.alice, chat)["run_id"]
    inst = unique("e")
    claim_run(api, api.executor, root, inst)
    child = api.post(f"/api/executor/runs/{root}/children", api.executor,
                     json={"executor_instance_id": inst, "agent_id": "echo", "input": "sub"}).json()
    assert api.post(f"/api/agent-runs/{root}/cancel", api.alice).json()["status"] == "cancelling"
    assert api.get(f"/api/agent-runs/{child['run_id']}", api.alice).json()["status"] == "cancelled"


# ---- trees -------------------------------------------------------------------------------------


def test_tree_from_any_node_lists_parents_before_children(api, chat):
    create_agent(api, api.admin, "worker", name="Worker")
    root = post_message(api, api.alice, chat, "plan")["run_id"]
    inst = unique("e")
    claim_run(api, api.executor, root, inst)

    def delegate(parent, instance, agent="worker"):
        reply = api.post(f"/api/executor/runs/{parent}/children", api.executor,
                         json={"executor_instance_id": instance, "agent_id": agent, "input": "go"})
        assert reply.status == 201, reply
        body = reply.json()
        assert set(body) == {"run_id", "events_url"}
        assert body["events_url"] == f"/api/agent-runs/{body['run_id']}/events"
        return body["run_id"]

    a = delegate(root, inst)
    b = delegate(root, inst, "echo")
    inst_a = unique("e")
    claim_run(api, api.executor, a, inst_a)
    grandchild = delegate(a, inst_a)

    trees = {node: api.get(f"/api/agent-runs/{node}/tree", api.alice) for node in (root, a, b, grandchild)}
    first = trees[root].json()
    assert all(t.status == 200 and t.json() == first for t in trees.values())
    assert first["root_run_id"] == root
    nodes = first["nodes"]
    assert [n["run_id"] for n in nodes] == [root, a, b, grandchild]
    position = {n["run_id"]: i for i, n in enumerate(nodes)}
    for n in nodes:
        assert {"run_id", "parent_run_id", "agent_id", "agent_name", "status", "events_url",
                "created_at", "started_at", "finished_at"} <= set(n)
        if n["parent_run_id"]:
            assert position[n["parent_run_id"]] < position[n["run_id"]]
    assert [(n["parent_run_id"], n["agent_name"], n["status"]) for n in nodes] == [
        (None, "Echo", "running"), (root, "Worker", "running"),
        (root, "Echo", "running"),  # claim_run claims every claimable run, b included
        (a, "Worker", "queued")]

    child = api.get(f"/api/agent-runs/{grandchild}", api.alice).json()
    assert child["session_id"] is None and child["root_run_id"] == root
    assert child["parent_run_id"] == a and child["thread_id"] != first["nodes"][0].get("thread_id")
    assert child["owner_id"] == "alice"
    assert _ids(api, api.alice, root_run_id=root) == _ids(api, api.viewer, root_run_id=root)
    assert set(_ids(api, api.alice, root_run_id=root)) == {root, a, b, grandchild}
    parent_events = [e["type"] for e in api.get(f"/api/agent-runs/{root}/events", api.alice).json()["events"]]
    assert parent_events.count("run.child_created") == 2

    # a child's completion is reported to its parent
    complete_run(api, api.executor, grandchild)
    a_events = api.get(f"/api/agent-runs/{a}/events", api.alice).json()["events"]
    assert a_events[-1]["type"] == "run.child_finished"
    assert a_events[-1]["data"] == {"child_run_id": grandchild, "status": "succeeded"}


# ---- provenance --------------------------------------------------------------------------------


def test_provenance_answers_the_auditors_question_in_one_call(api, chat):
    context = [{"id": "kb-7", "title": "Refunds", "content": "30 days", "version": "2024-05"}]
    posted = post_message(api, api.alice, chat, "refund?", context=context)
    complete_run(api, api.executor, posted["run_id"], texts=("Within ", "30 days."))
    run = api.get(f"/api/agent-runs/{posted['run_id']}", api.alice).json()
    api.request("PUT", "/api/agents/echo", token=api.admin, json={"name": "Echo II", "kind": "echo"})

    for token in (api.alice, api.viewer, api.admin):
        reply = api.get(f"/api/messages/{run['final_message_id']}/provenance", token)
        assert reply.status == 200
        prov = reply.json()
        assert set(prov) == {"message", "run", "agent", "agent_execution_snapshot",
                             "context_pack_snapshot", "session", "history"}
        assert prov["message"]["id"] == run["final_message_id"]
        assert prov["message"]["role"] == "assistant" and prov["message"]["content"] == "Within 30 days."
        assert prov["run"] == run
        assert prov["agent"] == {"id": "echo", "name": "Echo", "version": 1}
        assert prov["agent_execution_snapshot"] == run["agent_execution_snapshot"]
        assert prov["context_pack_snapshot"] == run["context_pack_snapshot"]
        assert [i["id"] for i in prov["context_pack_snapshot"]["items"]] == ["kb-7"]
        assert prov["session"]["id"] == chat and prov["session"]["owner_id"] == "alice"


def test_provenance_of_a_child_runs_answer_has_no_session(api, chat):
    root = post_message(api, api.alice, chat)["run_id"]
    inst = unique("e")
    claim_run(api, api.executor, root, inst)
    child = api.post(f"/api/executor/runs/{root}/children", api.executor,
                     json={"executor_instance_id": inst, "agent_id": "echo", "input": "sub"}).json()
    complete_run(api, api.executor, child["run_id"], texts=("sub answer",))
    final = api.get(f"/api/agent-runs/{child['run_id']}", api.alice).json()["final_message_id"]
    prov = api.get(f"/api/messages/{final}/provenance", api.alice).json()
    assert prov["session"] is None and prov["run"]["parent_run_id"] == root
    assert prov["message"]["content"] == "sub answer"
    # the child's answer is not part of the session's history
    history = api.get(f"/api/sessions/{chat}/messages", api.alice).json()["items"]
    assert final not in [m["id"] for m in history]


def test_paging_is_exact_when_many_rows_share_one_timestamp(api):
    """Keyset pages must break ties on the id: rows written at one instant (a historical
    import, or one PostgreSQL transaction) still come exactly once each."""
    from datetime import UTC, datetime

    from ingest.runs import post_message as ingest_post
    from ingest.runs import request_checksum
    from ingest.sessions import create_session

    instant = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
    with api.db.write() as s:
        s.info["clock"] = instant
        chats = [create_session(s, owner_id="alice", agent_id="echo", title=f"t{i}")
                 for i in range(6)]
        runs = []
        for i in range(9):
            chat = chats[i % 2]
            runs.append(ingest_post(
                s, owner_id="alice", session_id=chat, idempotency_key=f"tie-{i}",
                checksum=request_checksum(f"/api/sessions/{chat}/messages", {"content": f"m{i}"}),
                content=f"m{i}",
            ).run_id)

    for limit in (1, 2, 4):
        sessions, _ = list_all(api, api.alice, "/api/sessions", limit=limit)
        assert sorted(s["id"] for s in sessions) == sorted(chats)
        assert len(sessions) == len(chats)
        listed, _ = list_all(api, api.alice, "/api/agent-runs", limit=limit)
        assert sorted(r["id"] for r in listed) == sorted(runs) and len(listed) == len(runs)
        history, _ = list_all(api, api.alice, f"/api/sessions/{chats[0]}/messages", limit=limit)
        assert [m["content"] for m in history] == ["m0", "m2", "m4", "m6", "m8"]
    assert {r["created_at"] for r in listed} == {instant.isoformat()}
