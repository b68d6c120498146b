"""The admin action log: written in the same transaction as each administrative action,
append-only, readable by viewers and admins through the API and the /audit page."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlencode

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError
from support.api import FlaskApi, assert_error, open_session, send
from support.dashboards import call, logged_in, make_app, tokens

from agentledger.core.schema import AdminAction


@pytest.fixture
def api(db, db_url):
    app = FlaskApi(db, db_url)
    yield app
    app.close()


def _log(api, **query) -> list[dict]:
    reply = api.get("/api/admin-actions?" + urlencode(query), token=api.admin)
    assert reply.status == 200, reply
    return reply.json()["items"]


def _count(db) -> int:
    with db.read() as s:
        return s.execute(select(func.count()).select_from(AdminAction)).scalar_one()


def test_each_administrative_action_is_logged_with_who_and_what(api):
    assert api.post("/api/agents", token=api.admin,
                    json={"id": "helper", "name": "Helper", "kind": "echo"}).status == 201
    assert api.request("PUT", "/api/agents/helper", token=api.admin,
                       json={"name": "Helper 2", "kind": "echo"}).status == 200
    chat = open_session(api.http, api.alice)["id"]
    run = send(api.http, api.alice, chat, "hi").json()["run_id"]
    assert api.post(f"/api/agent-runs/{run}/cancel", token=api.alice).status == 202
    assert api.request("DELETE", f"/api/sessions/{chat}", token=api.alice).status == 204
    actions = [(a["action"], a["actor"], a["actor_role"], a["target_id"]) for a in _log(api)]
    assert actions == [
        ("session.deleted", "alice", "user", chat),
        ("run.cancel_requested", "alice", "user", run),
        ("agent.versioned", "root", "admin", "helper"),
        ("agent.registered", "root", "admin", "helper"),
    ]
    assert _log(api, action="agent.versioned")[0]["detail"] == {"version": 2, "name": "Helper 2"}
    assert [a["action"] for a in _log(api, actor="root")] == ["agent.versioned", "agent.registered"]


def test_a_refused_action_leaves_no_entry(api):
    before = _count(api.db)
    assert api.post("/api/agents", token=api.admin,
                    json={"id": "echo", "name": "Again", "kind": "echo"}).status == 409
    chat = open_session(api.http, api.alice)["id"]
    assert_error(api.request("DELETE", f"/api/sessions/{chat}", token=api.bob), 404, "not_found")
    assert _count(api.db) == before


def test_only_viewers_and_admins_read_the_log(api):
    assert api.get("/api/admin-actions", token=api.viewer).status == 200
    assert_error(api.get("/api/admin-actions", token=api.alice), 403, "forbidden")
    assert_error(api.get("/api/admin-actions"), 401, "unauthenticated")
    assert_error(api.get("/api/admin-actions?action=x", token=api.admin), 400, "invalid_request")


def test_the_log_is_append_only_in_the_database(api):
    api.post("/api/agents", token=api.admin, json={"id": "a1", "name": "A", "kind": "echo"})
    for statement in ("UPDATE admin_action SET actor = 'someone else'", "DELETE FROM admin_action"):
        with pytest.raises(DBAPIError):
            with api.db.engine.begin() as conn:
                conn.execute(text(statement))
    assert _count(api.db) == 1


def test_cli_token_commands_are_logged(db, db_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env["AGENTLEDGER_DATABASE_URL"] = db_url
    created = subprocess.run([sys.executable, "-m", "agentledger.cli", "token", "create",
                              "--owner", "carol", "--role", "viewer"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    token_id = created.stderr.split()[3]
    revoked = subprocess.run([sys.executable, "-m", "agentledger.cli", "token", "revoke", token_id],
                             env=env, capture_output=True, text=True, timeout=60)
    assert revoked.returncode == 0, revoked.stderr
    with db.read() as s:
        rows = s.execute(select(AdminAction.action, AdminAction.target_id, AdminAction.actor)
                         .order_by(AdminAction.at)).all()
    assert [(r.action, r.target_id) for r in rows] == [("token.created", token_id),
                                                       ("token.revoked", token_id)]
    assert all(r.actor.startswith("cli:") for r in rows)


def test_the_audit_page_lists_the_actions_and_links_them_as_json(db):
    app = make_app(db)
    outputs = [("audit-grid", "rowData"), ("audit-grid", "style"), ("audit-empty", "children"),
               ("audit-empty", "style"), ("audit-pager", "data"), ("audit-prev", "disabled"),
               ("audit-next", "disabled"), ("audit-page-label", "children"),
               ("audit-url", "search"), ("audit-json", "href")]
    try:
        keys = tokens(db)
        admin = app.test_client()
        bearer = {"Authorization": f"Bearer {keys['admin']}"}
        assert admin.post("/api/agents", json={"id": "paged", "name": "P", "kind": "echo"},
                          headers=bearer).status_code == 201
        assert admin.put("/api/agents/paged", json={"id": "paged", "name": "P2", "kind": "echo"},
                         headers=bearer).status_code == 200
        client = logged_in(app, keys["viewer"])
        assert client.get("/audit").status_code == 200
        out = call(client, outputs,
                   [("audit-action", "value", "any"), ("audit-actor", "value", None),
                    ("audit-prev", "n_clicks", None), ("audit-next", "n_clicks", None)],
                   [("audit-pager", "data", None), ("audit-url", "search", "")])
        rows = out["audit-grid"]["rowData"]
        assert [(r["action"], r["target"]) for r in rows] == [
            ("agent.versioned", "agent paged"), ("agent.registered", "agent paged")]
        assert out["audit-json"]["href"] == "/api/admin-actions?limit=50"
        # The page's filters travel in its JSON link: followed, it returns the page's rows.
        actor = rows[0]["actor"]
        out = call(client, outputs,
                   [("audit-action", "value", "agent.registered"), ("audit-actor", "value", actor),
                    ("audit-prev", "n_clicks", None), ("audit-next", "n_clicks", None)],
                   [("audit-pager", "data", None), ("audit-url", "search", "")])
        href = out["audit-json"]["href"]
        assert href == "/api/admin-actions?" + urlencode(
            {"action": "agent.registered", "actor": actor, "limit": 50})
        twin = admin.get(href, headers=bearer).get_json()["items"]
        assert [(i["action"], i["actor"]) for i in twin] == [
            (r["action"], r["actor"]) for r in out["audit-grid"]["rowData"]] == [
            ("agent.registered", actor)]
    finally:
        app.extensions["agentledger"].close()
