"""Who may open the dashboards (CONTRACT §6): pages and every Dash endpoint need a login with role
viewer or admin; callbacks are protected exactly like pages; the API keeps its own answers."""

from __future__ import annotations

import json
import re

import pytest
from support.dashboards import csrf_headers, dash_request, logged_in, make_app, tokens

PAGES = ("/", "/messages", "/messages/msg_x", "/runs", "/runs/run_x", "/timeline", "/interrupted",
         "/leases", "/agents")
DASH_ENDPOINTS = (("GET", "/_dash-layout"), ("GET", "/_dash-dependencies"),
                  ("POST", "/_dash-update-component"), ("GET", "/_favicon.ico"),
                  ("GET", "/assets/00-bootstrap-5.3.8.min.css"))
CALLBACK = dash_request([("run-node", "children")],
                        [("run-tree", "tapNodeData", None), ("run-id", "data", "run_x")],
                        changed=["run-id.data"])


@pytest.fixture
def app(db):
    return make_app(db)


@pytest.fixture
def keys(db):
    return tokens(db)


@pytest.mark.parametrize("path", PAGES + ("/runs?status=failed&window=30d",))
def test_anonymous_pages_redirect_to_login_with_next(app, path):
    reply = app.test_client().get(path)
    assert reply.status_code == 303
    location = reply.headers["Location"]
    assert location.startswith("/login?next=")
    follow = app.test_client().get(location)
    assert follow.status_code == 200 and b'name="next"' in follow.data
    assert f'value="{path}"'.replace("&", "&amp;").encode() in follow.data


@pytest.mark.parametrize("method, path", DASH_ENDPOINTS)
def test_anonymous_dash_endpoints_are_refused_with_json(app, method, path):
    with app.test_client().open(path, method=method,
                                json=CALLBACK if method == "POST" else None) as reply:
        assert reply.status_code == 401
        assert reply.get_json() == {"error": {"code": "unauthenticated",
                                              "message": "log in at /login to use the dashboards"}}


def test_an_anonymous_callback_reveals_nothing(app, db):
    reply = app.test_client().post("/_dash-update-component", json=CALLBACK)
    assert reply.status_code == 401 and b"run-node" not in reply.data


def test_a_bad_bearer_token_is_refused_too(app):
    reply = app.test_client().post("/_dash-update-component", json=CALLBACK,
                                   headers={"Authorization": "Bearer al_not-a-token"})
    assert reply.status_code == 401


@pytest.mark.parametrize("role", ["user", "executor"])
def test_other_roles_get_403(app, keys, role):
    client = logged_in(app, keys[role])
    page = client.get("/runs")
    assert page.status_code == 403 and b"viewer and admin" in page.data
    assert b"Log out" in page.data
    callback = client.post("/_dash-update-component", json=CALLBACK)
    assert callback.status_code == 403
    assert callback.get_json()["error"]["code"] == "forbidden"
    bearer = app.test_client().get("/_dash-layout",
                                   headers={"Authorization": f"Bearer {keys[role]}"})
    assert bearer.status_code == 403


@pytest.mark.parametrize("role", ["viewer", "admin"])
def test_viewers_and_admins_get_every_page_and_endpoint(app, keys, role):
    client = logged_in(app, keys[role])
    for path in PAGES:
        reply = client.get(path)
        assert reply.status_code == 200, path
        assert b"_dash-renderer" in reply.data or b"dash_renderer" in reply.data
    for method, path in DASH_ENDPOINTS:
        with client.open(path, method=method, json=CALLBACK if method == "POST" else None,
                         headers=csrf_headers(client)) as reply:
            assert reply.status_code in (200, 204), (path, reply.status_code, reply.data[:200])


def test_bearer_tokens_work_for_scripts(app, keys):
    reply = app.test_client().get("/_dash-layout",
                                  headers={"Authorization": f"Bearer {keys['viewer']}"})
    assert reply.status_code == 200 and b"agentledger" in reply.data


def test_logout_ends_the_dashboard_session(app, keys):
    client = logged_in(app, keys["viewer"])
    assert client.get("/").status_code == 200
    client.get("/logout")
    assert client.get("/").status_code == 303
    assert client.post("/_dash-update-component", json=CALLBACK).status_code == 401


def test_the_api_keeps_its_json_answers_next_to_the_dashboards(app, keys):
    client = app.test_client()
    missing = client.get("/api/no-such-route")
    assert missing.status_code == 404
    assert missing.get_json()["error"]["code"] == "not_found"
    assert client.post("/api/no-such-route").status_code == 404
    wrong = client.delete("/api/health")
    assert wrong.status_code == 405 and wrong.get_json()["error"]["code"] == "method_not_allowed"
    assert "GET" in wrong.headers["Allow"]
    assert client.get("/api/health").status_code == 200
    assert client.get("/api/agent-runs").status_code == 401  # the API's own authentication
    # a method a page-side path does not take is a program's mistake: JSON too
    for method, path in (("POST", "/metrics"), ("DELETE", "/login"), ("PUT", "/logout")):
        wrong = client.open(path, method=method)
        assert wrong.status_code == 405, (method, path)
        assert wrong.get_json() == {"error": {
            "code": "method_not_allowed", "message": f"{method} is not allowed on {path}"}}
        assert method not in wrong.headers["Allow"] and "GET" in wrong.headers["Allow"]
    assert client.get("/login").status_code == 200


def test_debug_tools_are_off(app, keys):
    page = logged_in(app, keys["viewer"]).get("/").data.decode()
    config = json.loads(re.search(r'id="_dash-config" type="application/json">(.*?)</script>',
                                  page).group(1))
    assert config["ui"] is False and config["props_check"] is False
    assert config["disable_version_check"] is True
    assert "hot_reload" not in config


def _declared(app) -> dict[str, set[str]]:
    """Every API path of the OpenAPI document (parameters filled in) and its methods."""
    doc = app.test_client().get("/api/openapi.json").get_json()
    return {re.sub(r"\{[a-z_]+\}", "x_1", path): {m.upper() for m in ops}
            for path, ops in doc["paths"].items()}


def test_every_api_path_answers_405_and_options_with_the_apis_own_allow(app, keys):
    """Beside the dashboards' catch-all GET route, a POST-only API path is still a 405 for GET
    (not a 404), and its ``Allow`` never advertises the catch-all's GET."""
    client = app.test_client()
    declared = _declared(app)
    assert len(declared) >= 15
    for path, methods in declared.items():
        expected = set(methods) | {"OPTIONS"} | ({"HEAD"} if "GET" in methods else set())
        options = client.options(path)
        assert options.status_code == 204, path
        assert set(options.headers["Allow"].split(", ")) == expected, (path, options.headers)
        for method in {"GET", "POST", "PUT", "PATCH", "DELETE", "TRACE"} - methods:
            reply = client.open(path, method=method)
            assert reply.status_code == 405, (method, path, reply.status_code)
            assert reply.get_json()["error"]["code"] == "method_not_allowed"
            assert set(reply.headers["Allow"].split(", ")) == expected, (method, path)


def test_options_on_an_unknown_api_path_is_a_json_404(app):
    reply = app.test_client().options("/api/no-such-route")
    assert reply.status_code == 404 and reply.get_json()["error"]["code"] == "not_found"


def test_first_requests_at_once_run_dashs_setup_once_and_wait_for_it(db, monkeypatch):
    """Dash sets the server up on its first request (API routes included). Requests that
    arrive together on a fresh app run that setup once, each waits for it, and none fails."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from dash import Dash

    entered = []
    dash_setup = Dash._setup_server

    def slow_setup(self):
        entered.append(threading.get_ident())
        time.sleep(0.3)  # a wide window before Dash checks and sets its own flag
        dash_setup(self)

    monkeypatch.setattr(Dash, "_setup_server", slow_setup)
    app = make_app(db)
    together = threading.Barrier(4)

    def first_request(_):
        client = app.test_client()
        together.wait()
        return client.get("/api/health").status_code

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(first_request, range(4))) == [200] * 4
    assert len(entered) == 1


# --- malformed callback requests: a JSON 400, nothing run, nothing logged as an error ------------

def _with(**changes) -> dict:
    return {**CALLBACK, **changes}


RUN_NODE_INPUTS = CALLBACK["inputs"]
MALFORMED = {
    "empty object": {},
    "a list": [CALLBACK],
    "null": None,
    "a string": "run-node.children",
    "output not a string": _with(output=["run-node.children"]),
    "unknown output": _with(output="run-node.nothing"),
    "output of no callback": _with(output="no-such-component.children"),
    "inputs missing": {k: v for k, v in CALLBACK.items() if k != "inputs"},
    "inputs not a list": _with(inputs={"id": "run-id", "property": "data"}),
    "an input too few": _with(inputs=RUN_NODE_INPUTS[:1]),
    "an input too many": _with(inputs=[*RUN_NODE_INPUTS, RUN_NODE_INPUTS[0]]),
    "an input not an object": _with(inputs=[RUN_NODE_INPUTS[0], "run_x"]),
    "an input without an id": _with(inputs=[RUN_NODE_INPUTS[0], {"property": "data", "value": "x"}]),
    "an input of another component": _with(
        inputs=[RUN_NODE_INPUTS[0], {"id": "run-tree", "property": "data", "value": "run_x"}]),
    "an input of another property": _with(
        inputs=[RUN_NODE_INPUTS[0], {"id": "run-id", "property": "children", "value": "run_x"}]),
    "an input with a pattern id": _with(
        inputs=[RUN_NODE_INPUTS[0], {"id": {"type": "run-id"}, "property": "data"}]),
    "state where none is declared": _with(state=[{"id": "run-id", "property": "data"}]),
    "outputs missing": {k: v for k, v in CALLBACK.items() if k != "outputs"},
    "outputs of another component": _with(outputs={"id": "run-header", "property": "children"}),
    "outputs as a list of one": _with(outputs=[{"id": "run-node", "property": "children"}]),
    "changedPropIds not a list": _with(changedPropIds="run-id.data"),
    "changedPropIds not strings": _with(changedPropIds=[["run-id.data"]]),
    "changedPropIds without a property": _with(changedPropIds=["run-id"]),
    "changedPropIds with a broken pattern id": _with(
        changedPropIds=["{'type': 'event-log-next', 'log': 'run'}.n_clicks"]),
}


def _viewer(app, keys):
    client = logged_in(app, keys["viewer"])
    return client, csrf_headers(client)


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_callback_request_is_a_json_400(app, keys, body, caplog):
    client, headers = _viewer(app, keys)
    with caplog.at_level("WARNING"):
        reply = client.post("/_dash-update-component", json=body, headers=headers)
    assert reply.status_code == 400, reply.data[:300]
    assert reply.mimetype == "application/json"
    error = reply.get_json()["error"]
    assert error["code"] == "invalid_request" and error["message"]
    assert "Traceback" not in reply.get_data(as_text=True)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


@pytest.mark.parametrize("data, content_type", [
    (b"{not json", "application/json"), (b"", "application/json"),
    (b'{"output": "run-node.children"}', "text/plain"), (b"\xff\xfe", "application/json"),
])
def test_a_callback_body_that_is_not_json_is_a_json_400(app, keys, data, content_type, caplog):
    client, headers = _viewer(app, keys)
    with caplog.at_level("WARNING"):
        reply = client.post("/_dash-update-component", data=data, content_type=content_type,
                            headers=headers)
    assert reply.status_code == 400 and reply.mimetype == "application/json"
    assert reply.get_json()["error"]["code"] == "invalid_request"
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_scripts_get_the_same_400_and_a_real_callback_still_answers(app, keys):
    bearer = {"Authorization": f"Bearer {keys['viewer']}"}
    client = app.test_client()
    refused = client.post("/_dash-update-component", json={}, headers=bearer)
    assert refused.status_code == 400 and refused.get_json()["error"]["code"] == "invalid_request"
    answered = client.post("/_dash-update-component", json=CALLBACK, headers=bearer)
    assert answered.status_code == 200
    assert list(answered.get_json()["response"]) == ["run-node"]
    # The one malformed request changed nothing: the real one after it reads as before.
    viewer, headers = _viewer(app, keys)
    assert viewer.post("/_dash-update-component", json=CALLBACK, headers=headers).status_code == 200
