"""Agents and their immutable versions (CONTRACT §5) through the Flask test client."""

from __future__ import annotations

from support.api import assert_error, assert_iso_utc, create_agent, list_all, row_counts

VERSION_FIELDS = {"version", "name", "kind", "model", "instructions", "tools", "params",
                  "content_hash", "created_at"}


def test_register_an_agent_returns_201_with_version_1(api):
    reply = api.post("/api/agents", api.admin, json={
        "id": "support-bot", "name": "Support Bot", "kind": "scripted", "model": "gpt-x",
        "instructions": "Be kind.", "tools": [{"name": "search"}],
        "params": {"steps": [{"say": "You said: {input}"}, {"sleep": 0.01}]},
    })
    assert reply.status == 201
    agent = reply.json()
    assert agent["id"] == "support-bot" and agent["version"] == 1
    assert VERSION_FIELDS <= set(agent)
    assert (agent["name"], agent["kind"], agent["model"]) == ("Support Bot", "scripted", "gpt-x")
    assert agent["tools"] == [{"name": "search"}] and agent["params"]["steps"][1] == {"sleep": 0.01}
    assert len(agent["content_hash"]) == 64
    assert_iso_utc(agent["created_at"])
    assert [v["version"] for v in agent["versions"]] == [1]


def test_an_existing_id_is_409_conflict(api):
    before = row_counts(api.db)
    reply = api.post("/api/agents", api.admin, json={"id": "echo", "name": "Again", "kind": "echo"})
    assert_error(reply, 409, "conflict")
    assert row_counts(api.db) == before
    assert api.get("/api/agents/echo", api.alice).json()["name"] == "Echo"


def test_put_adds_the_next_immutable_version(api):
    v1 = create_agent(api, api.admin, "writer", name="Writer", model="m1")
    v2 = api.request("PUT", "/api/agents/writer", token=api.admin,
                     json={"name": "Writer Pro", "kind": "echo", "model": "m2"})
    assert v2.status == 200
    body = v2.json()
    assert body["version"] == 2 and body["name"] == "Writer Pro" and body["model"] == "m2"
    assert [v["version"] for v in body["versions"]] == [1, 2]
    assert {k: body["versions"][0][k] for k in VERSION_FIELDS} == {k: v1[k] for k in VERSION_FIELDS}
    assert body["versions"][0]["name"] == "Writer" and body["versions"][0]["model"] == "m1"
    assert body["content_hash"] != v1["content_hash"]
    # the id in the body may be repeated, but must match
    same = api.request("PUT", "/api/agents/writer", token=api.admin,
                       json={"id": "writer", "name": "Writer 3", "kind": "echo"})
    assert same.status == 200 and same.json()["version"] == 3
    assert_error(api.request("PUT", "/api/agents/writer", token=api.admin,
                             json={"id": "other", "name": "x", "kind": "echo"}), 422, "validation_error")
    detail = api.get("/api/agents/writer", api.viewer).json()
    assert detail["version"] == 3 and [v["name"] for v in detail["versions"]] == [
        "Writer", "Writer Pro", "Writer 3"]


def test_list_agents_pages_by_id(api):
    for agent_id in ("delta", "alpha", "charlie", "bravo"):
        create_agent(api, api.admin, agent_id)
    items, pages = list_all(api, api.alice, "/api/agents", limit=2)
    assert [a["id"] for a in items] == ["alpha", "bravo", "charlie", "delta", "echo"]
    assert pages == 3
    for role_token in (api.viewer, api.admin):
        assert api.get("/api/agents", role_token).status == 200
    assert api.get("/api/agents", api.executor).status == 403  # executors read runs, nothing else
