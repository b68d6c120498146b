"""Sessions, history and posting messages (CONTRACT §5) through the Flask test client."""

from __future__ import annotations

import json

import pytest
from support.api import (
    MESSAGE_FIELDS,
    POSTED_FIELDS,
    answer,
    assert_error,
    assert_iso_utc,
    create_agent,
    list_all,
    open_session,
    post_message,
    row_counts,
    send,
    unique,
)

SESSION_FIELDS = {"id", "title", "agent_id", "owner_id", "created_at"}


@pytest.fixture
def chat(api):
    return open_session(api, api.alice, title="first")["id"]


# ---- sessions ----------------------------------------------------------------------------------


def test_create_session_returns_201_with_the_contract_fields(api):
    reply = api.post("/api/sessions", api.alice, json={"agent_id": "echo", "title": "Planning"})
    assert reply.status == 201
    body = reply.json()
    assert SESSION_FIELDS <= set(body)
    assert body["id"].startswith("sess_") and body["title"] == "Planning"
    assert body["agent_id"] == "echo" and body["owner_id"] == "alice"
    assert_iso_utc(body["created_at"])
    assert "thread_id" not in body  # clients never see or send a thread id
    untitled = api.post("/api/sessions", api.alice, json={"agent_id": "echo"}).json()
    assert untitled["title"] is None


def test_get_patch_and_list_sessions(api, chat):
    assert api.get(f"/api/sessions/{chat}", api.alice).json()["title"] == "first"
    create_agent(api, api.admin, "other", name="Other")

    patched = api.request("PATCH", f"/api/sessions/{chat}", token=api.alice,
                          json={"title": "renamed", "agent_id": "other"})
    assert patched.status == 200
    assert (patched.json()["title"], patched.json()["agent_id"]) == ("renamed", "other")
    only_title = api.request("PATCH", f"/api/sessions/{chat}", token=api.alice, json={"title": None})
    assert only_title.status == 200
    assert (only_title.json()["title"], only_title.json()["agent_id"]) == (None, "other")
    assert api.request("PATCH", f"/api/sessions/{chat}", token=api.alice, json={}).status == 200

    bobs = open_session(api, api.bob)["id"]
    mine = [s["id"] for s in api.get("/api/sessions", api.alice).json()["items"]]
    assert mine == [chat]
    everyone = {s["id"] for s in api.get("/api/sessions", api.viewer).json()["items"]}
    assert everyone == {chat, bobs}
    assert api.get(f"/api/sessions/{bobs}", api.admin).json()["owner_id"] == "bob"
    # an admin may edit anyone's session; a viewer may not edit at all
    assert api.request("PATCH", f"/api/sessions/{bobs}", token=api.admin,
                       json={"title": "by admin"}).status == 200
    assert_error(api.request("PATCH", f"/api/sessions/{bobs}", token=api.viewer,
                             json={"title": "no"}), 403, "forbidden")


def test_sessions_page_through_every_item_exactly_once(api):
    created = [open_session(api, api.alice, title=f"s{i}")["id"] for i in range(7)]
    open_session(api, api.bob)
    items, pages = list_all(api, api.alice, "/api/sessions", limit=3)
    ids = [s["id"] for s in items]
    assert pages == 3 and len(ids) == 7 and set(ids) == set(created)
    assert ids == list(reversed(created))  # newest first
    one_page, pages = list_all(api, api.alice, "/api/sessions", limit=500)
    assert pages == 1 and [s["id"] for s in one_page] == ids


# ---- posting a message -------------------------------------------------------------------------


def test_post_message_returns_202_with_the_five_fields_and_queues_a_run(api, chat):
    reply = send(api, api.alice, chat, "What is the plan?")
    assert reply.status == 202 and "Idempotent-Replayed" not in reply.headers
    body = reply.json()
    assert set(body) == POSTED_FIELDS
    assert body["run_id"].startswith("run_") and body["message_id"].startswith("msg_")
    assert body["events_url"] == f"/api/agent-runs/{body['run_id']}/events"
    assert (body["agent_id"], body["agent_name"]) == ("echo", "Echo")

    run = api.get(f"/api/agent-runs/{body['run_id']}", api.alice).json()
    assert run["status"] == "queued" and run["session_id"] == chat
    assert run["owner_id"] == "alice" and run["root_run_id"] == run["id"]
    assert run["parent_run_id"] is None and run["last_event_seq"] == 1
    events = api.get(body["events_url"], api.alice).json()["events"]
    assert [(e["seq"], e["type"]) for e in events] == [(1, "run.queued")]
    assert events[0]["data"]["agent_id"] == "echo" and events[0]["data"]["session_id"] == chat

    history = api.get(f"/api/sessions/{chat}/messages", api.alice).json()["items"]
    assert len(history) == 1 and set(history[0]) >= MESSAGE_FIELDS
    assert history[0]["id"] == body["message_id"] and history[0]["role"] == "user"
    assert history[0]["content"] == "What is the plan?" and history[0]["run_id"] == body["run_id"]


def test_context_items_are_frozen_into_the_runs_pack(api, chat):
    context = [{"id": "doc-1", "title": "Policy", "content": "be brief", "version": 3},
               {"id": "doc-2", "title": "Notes", "content": "none"}]
    posted = post_message(api, api.alice, chat, "use the docs", context=context)
    pack = api.get(f"/api/agent-runs/{posted['run_id']}", api.alice).json()["context_pack_snapshot"]
    assert [(i["id"], i["title"], i["version"]) for i in pack["items"]] == [
        ("doc-1", "Policy", 3), ("doc-2", "Notes", None)]
    assert all(len(i["sha256"]) == 64 and "content" not in i for i in pack["items"])
    assert len(pack["pack_hash"]) == 64
    claimed = api.post("/api/executor/claim", api.executor,
                       json={"executor_instance_id": unique("e")}).json()["runs"]
    assert [c["content"] for c in claimed[0]["context"]] == ["be brief", "none"]


def test_an_admin_posts_into_a_users_session_as_that_user(api, chat):
    posted = post_message(api, api.admin, chat, "from the admin")
    run = api.get(f"/api/agent-runs/{posted['run_id']}", api.alice).json()
    assert run["owner_id"] == "alice"


def test_a_posted_message_may_name_another_agent_for_that_run_only(api, chat):
    create_agent(api, api.admin, "critic", name="Critic")
    posted = post_message(api, api.alice, chat, "critique this", agent_id="critic")
    assert (posted["agent_id"], posted["agent_name"]) == ("critic", "Critic")
    assert api.get(f"/api/sessions/{chat}", api.alice).json()["agent_id"] == "echo"
    assert post_message(api, api.alice, chat, "and now?")["agent_id"] == "echo"


# ---- idempotency -------------------------------------------------------------------------------


def test_replaying_the_same_request_returns_the_original_response_and_writes_nothing(api, chat):
    key = unique("idem")
    first = send(api, api.alice, chat, "once", key=key)
    before = row_counts(api.db)
    for _ in range(3):
        again = send(api, api.alice, chat, "once", key=key)
        assert again.status == 202
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert again.json() == first.json()
    # the same JSON with other whitespace and key order is the same request
    raw = json.dumps({"content": "once"}, indent=4).encode()
    spaced = api.post(f"/api/sessions/{chat}/messages", api.alice, data=raw,
                      headers={"Idempotency-Key": key})
    assert spaced.status == 202 and spaced.headers.get("Idempotent-Replayed") == "true"
    assert spaced.json() == first.json()
    assert row_counts(api.db) == before
    assert len(api.get(f"/api/sessions/{chat}/messages", api.alice).json()["items"]) == 1


def test_a_replay_after_the_run_finished_is_still_the_original_202(api, chat):
    key = unique("idem")
    first = send(api, api.alice, chat, "answer me", key=key).json()
    from support.api import complete_run

    complete_run(api, api.executor, first["run_id"])
    again = send(api, api.alice, chat, "answer me", key=key)
    assert again.status == 202 and again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == first


@pytest.mark.parametrize("change", ["content", "agent_id", "context", "session"])
def test_the_same_key_for_a_different_request_is_409_and_writes_nothing(api, chat, change):
    create_agent(api, api.admin, "critic", name="Critic")
    other_chat = open_session(api, api.alice)["id"]
    key = unique("idem")
    send(api, api.alice, chat, "original", key=key)
    before = row_counts(api.db)
    kwargs = {
        "content": dict(session_id=chat, content="different"),
        "agent_id": dict(session_id=chat, content="original", agent_id="critic"),
        "context": dict(session_id=chat, content="original",
                        context=[{"id": "d", "title": "t", "content": "c"}]),
        "session": dict(session_id=other_chat, content="original"),
    }[change]
    session_id = kwargs.pop("session_id")
    content = kwargs.pop("content")
    reply = send(api, api.alice, session_id, content, key=key, expect=None, **kwargs)
    assert_error(reply, 409, "idempotency_conflict")
    assert row_counts(api.db) == before


def test_keys_belong_to_their_owner(api, chat):
    key = unique("shared")
    bobs_chat = open_session(api, api.bob)["id"]
    alice_run = post_message(api, api.alice, chat, "same words", key=key)["run_id"]
    bob_reply = send(api, api.bob, bobs_chat, "same words", key=key)
    assert "Idempotent-Replayed" not in bob_reply.headers
    assert bob_reply.json()["run_id"] != alice_run


# ---- history -----------------------------------------------------------------------------------


def test_history_keeps_each_answers_agent_after_a_rename_and_an_agent_switch(api):
    create_agent(api, api.admin, "helper", name="Helper")
    create_agent(api, api.admin, "critic", name="Critic")
    chat = open_session(api, api.alice, "helper", title="history")["id"]

    first, answer1 = answer(api, api.alice, api.executor, chat, "q1", texts=("a", "1"))
    renamed = api.request("PUT", "/api/agents/helper", token=api.admin,
                          json={"name": "Helper Renamed", "kind": "echo", "model": "m-2"})
    assert renamed.status == 200 and renamed.json()["version"] == 2
    second, answer2 = answer(api, api.alice, api.executor, chat, "q2", agent_id="critic",
                             texts=("critique",))
    third, answer3 = answer(api, api.alice, api.executor, chat, "q3", texts=("a3",))
    # switching the session's default agent afterwards rewrites nothing either
    api.request("PATCH", f"/api/sessions/{chat}", token=api.alice, json={"agent_id": "critic"})
    assert second["agent_name"] == "Critic" and third["agent_name"] == "Helper Renamed"

    items = api.get(f"/api/sessions/{chat}/messages", api.alice).json()["items"]
    got = [(m["role"], m["content"], m["agent_id"], m["agent_name"], m["agent_version"])
           for m in items]
    assert got == [
        ("user", "q1", "helper", "Helper", 1),
        ("assistant", "a1", "helper", "Helper", 1),
        ("user", "q2", "critic", "Critic", 1),
        ("assistant", "critique", "critic", "Critic", 1),
        ("user", "q3", "helper", "Helper Renamed", 2),
        ("assistant", "a3", "helper", "Helper Renamed", 2),
    ]
    assert [m["id"] for m in items if m["role"] == "assistant"] == [answer1, answer2, answer3]
    assert [m["run_id"] for m in items] == [first["run_id"]] * 2 + [second["run_id"]] * 2 + [
        third["run_id"]] * 2
    for m in items:
        assert set(m) >= MESSAGE_FIELDS
        assert_iso_utc(m["created_at"])

    prov = api.get(f"/api/messages/{answer1}/provenance", api.viewer).json()
    assert prov["agent"] == {"id": "helper", "name": "Helper", "version": 1}
    assert prov["agent_execution_snapshot"]["model"] is None  # v1 had no model; v2 does

    # paging the history returns the same sequence
    paged, pages = list_all(api, api.alice, f"/api/sessions/{chat}/messages", limit=4)
    assert pages == 2 and [m["id"] for m in paged] == [m["id"] for m in items]
    paged, pages = list_all(api, api.alice, f"/api/sessions/{chat}/messages", limit=1)
    assert pages == 6 and [m["id"] for m in paged] == [m["id"] for m in items]


# ---- soft delete -------------------------------------------------------------------------------


def test_deleting_a_session_hides_it_from_its_owner_but_keeps_it_for_audit(api, chat):
    posted, answer_id = answer(api, api.alice, api.executor, chat, "keep me")
    run = posted["run_id"]
    reply = api.request("DELETE", f"/api/sessions/{chat}", token=api.alice)
    assert reply.status == 204 and reply.body == b""

    for method, path in [
        ("GET", f"/api/sessions/{chat}"), ("GET", f"/api/sessions/{chat}/messages"),
        ("PATCH", f"/api/sessions/{chat}"), ("DELETE", f"/api/sessions/{chat}"),
        ("GET", f"/api/agent-runs/{run}"), ("GET", f"/api/agent-runs/{run}/events"),
        ("GET", f"/api/agent-runs/{run}/tree"), ("GET", f"/api/messages/{answer_id}/provenance"),
        ("POST", f"/api/agent-runs/{run}/cancel"),
    ]:
        kwargs = {"json": {"title": "x"}} if method == "PATCH" else {}
        assert_error(api.request(method, path, token=api.alice, **kwargs), 404, "not_found")
    assert_error(send(api, api.alice, chat, "more", expect=None), 404, "not_found")
    assert api.get("/api/sessions", api.alice).json()["items"] == []
    assert api.get("/api/agent-runs", api.alice).json()["items"] == []

    for token in (api.admin, api.viewer):
        session = api.get(f"/api/sessions/{chat}", token)
        assert session.status == 200
        assert session.json()["deleted_at"] is not None
        assert_iso_utc(session.json()["deleted_at"])
        assert chat in [s["id"] for s in api.get("/api/sessions", token).json()["items"]]
        history = api.get(f"/api/sessions/{chat}/messages", token).json()["items"]
        assert [m["content"] for m in history] == ["keep me", "the answer"]
        assert api.get(f"/api/agent-runs/{run}", token).json()["status"] == "succeeded"
        assert [r["id"] for r in api.get("/api/agent-runs", token,
                                         query={"session_id": chat}).json()["items"]] == [run]
        events = api.get(f"/api/agent-runs/{run}/events", token).json()
        assert events["terminal"] is True and events["events"][-1]["type"] == "run.completed"
        prov = api.get(f"/api/messages/{answer_id}/provenance", token).json()
        assert prov["session"]["id"] == chat and prov["session"]["deleted_at"] is not None
        assert prov["run"]["id"] == run


def test_a_queued_run_of_a_deleted_session_cannot_be_cancelled_by_its_owner(api, chat):
    """One visibility rule for reads and writes: the owner's cancel is 404 (not 202), the run
    stays queued, and an admin can still cancel it."""
    run = post_message(api, api.alice, chat, "wait")["run_id"]
    assert api.request("DELETE", f"/api/sessions/{chat}", token=api.alice).status == 204
    assert_error(api.post(f"/api/agent-runs/{run}/cancel", api.alice), 404, "not_found")
    assert_error(api.post(f"/api/agent-runs/{run}/cancel", api.bob), 404, "not_found")
    assert api.get(f"/api/agent-runs/{run}", api.admin).json()["status"] == "queued"
    reply = api.post(f"/api/agent-runs/{run}/cancel", api.admin)
    assert reply.status == 202 and reply.json()["status"] == "cancelled"


def test_another_user_cannot_delete_and_an_admin_can(api, chat):
    assert_error(api.request("DELETE", f"/api/sessions/{chat}", token=api.bob), 404, "not_found")
    assert_error(api.request("DELETE", f"/api/sessions/{chat}", token=api.viewer), 403, "forbidden")
    assert api.get(f"/api/sessions/{chat}", api.alice).status == 200
    assert api.request("DELETE", f"/api/sessions/{chat}", token=api.admin).status == 204
    assert_error(api.get(f"/api/sessions/{chat}", api.alice), 404, "not_found")


def test_content_length_counts_characters_not_bytes(api, chat):
    for content in ("\u00e9" * 32_000, "\U0001f600" * 32_000, "mixed \u4e2d\u6587 \U0001f680"):
        posted = post_message(api, api.alice, chat, content)
        history = api.get(f"/api/sessions/{chat}/messages", api.alice).json()["items"]
        assert history[-1]["content"] == content and history[-1]["id"] == posted["message_id"]
    assert_error(send(api, api.alice, chat, "\U0001f600" * 32_001, expect=None), 422,
                 "validation_error")
