"""CSRF protection of cookie sessions and the security headers of every response."""

from __future__ import annotations

import pytest
from support.dashboards import csrf_headers, logged_in, make_app, tokens

CALLBACK = {"output": "run-node.children", "outputs": {"id": "run-node", "property": "children"},
            "inputs": [{"id": "run-tree", "property": "tapNodeData", "value": None},
                       {"id": "run-id", "property": "data", "value": "run_x"}],
            "state": [], "changedPropIds": ["run-id.data"]}


@pytest.fixture
def app(db):
    app = make_app(db)
    yield app
    app.extensions["agentledger"].close()


@pytest.fixture
def keys(db):
    return tokens(db)


def test_login_sets_a_readable_csrf_cookie_and_an_httponly_session(app, keys):
    client = app.test_client()
    reply = client.get(f"/login?token={keys['admin']}")
    cookies = reply.headers.getlist("Set-Cookie")
    session_cookie = next(c for c in cookies if c.startswith("agentledger_session="))
    csrf_cookie = next(c for c in cookies if c.startswith("_csrf_token="))
    assert "HttpOnly" in session_cookie and "SameSite=Lax" in session_cookie
    assert "HttpOnly" not in csrf_cookie and "SameSite=Lax" in csrf_cookie


@pytest.mark.parametrize("header", [None, "wrong-token"])
def test_cookie_requests_without_the_csrf_header_are_refused_and_write_nothing(app, keys, header):
    client = logged_in(app, keys["admin"])
    headers = {"X-CSRFToken": header} if header else {}
    agent = client.post("/api/agents", json={"id": "csrf-x", "name": "X", "kind": "echo"},
                        headers=headers)
    assert agent.status_code == 403
    assert agent.get_json()["error"]["code"] == "forbidden"
    assert client.get("/api/agents/csrf-x").status_code == 404
    callback = client.post("/_dash-update-component", json=CALLBACK, headers=headers)
    assert callback.status_code == 403


def test_cookie_requests_with_the_header_and_bearer_requests_pass(app, keys):
    client = logged_in(app, keys["admin"])
    reply = client.post("/api/agents", json={"id": "csrf-ok", "name": "Ok", "kind": "echo"},
                        headers=csrf_headers(client))
    assert reply.status_code == 201
    assert client.post("/_dash-update-component", json=CALLBACK,
                       headers=csrf_headers(client)).status_code == 200
    bearer = app.test_client().post("/api/agents", json={"id": "csrf-b", "name": "B", "kind": "echo"},
                                    headers={"Authorization": f"Bearer {keys['admin']}"})
    assert bearer.status_code == 201


@pytest.mark.parametrize("path", ["/api/health", "/login", "/api/no-such-route"])
def test_security_headers_on_every_response(app, path):
    reply = app.test_client().get(path)
    policy = reply.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    assert reply.headers["X-Frame-Options"] == "DENY"


def test_the_dashboard_page_gets_the_csp_with_dash_script_hashes(app, keys):
    client = logged_in(app, keys["viewer"])
    reply = client.get("/runs")
    assert reply.status_code == 200
    assert "'sha256-" in reply.headers["Content-Security-Policy"]


def test_the_session_cookie_is_verified_and_a_request_without_one_gets_none(app, keys):
    client = logged_in(app, keys["admin"])
    assert client.get("/api/agents").status_code == 200  # the signed cookie logs the admin in
    value = client.get_cookie("agentledger_session").value
    client.set_cookie("agentledger_session", value[:-4] + ("AAAA" if value[-4:] != "AAAA" else "BBBB"))
    assert client.get("/api/agents").status_code == 401  # a tampered cookie is nobody
    bearer = app.test_client().get("/api/agents",
                                   headers={"Authorization": f"Bearer {keys['admin']}"})
    assert bearer.status_code == 200
    assert not any(c.startswith("agentledger_session=")
                   for c in bearer.headers.getlist("Set-Cookie"))
