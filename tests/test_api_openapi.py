"""``/api/openapi.json``: complete (every Flask route under /api), well-formed, and truthful
(real responses, successes and errors, validate against the documented schemas)."""

from __future__ import annotations

import re

import pytest
from support.api import (
    FlaskHttp,
    Reply,
    answer,
    append,
    claim_run,
    create_agent,
    open_session,
    post_message,
    send,
    unique,
)

from agentledger.api import responses

HTTP_METHODS = {"get", "put", "post", "delete", "patch"}


def _openapi_path(rule: str) -> str:
    return re.sub(r"<(?:[a-z_]+:)?([a-z_]+)>", r"{\1}", rule)


@pytest.fixture
def doc(api):
    reply = api.get("/api/openapi.json")
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("application/json")
    return reply.json()


def test_every_api_route_of_the_app_is_documented_and_nothing_else(api, doc):
    routed = set()
    for rule in api.app.url_map.iter_rules():
        if not rule.rule.startswith("/api"):
            continue
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            routed.add((method.lower(), _openapi_path(rule.rule)))
    documented = {(method, path) for path, item in doc["paths"].items()
                  for method in item if method in HTTP_METHODS}
    assert routed == documented
    assert {p for _, p in routed} == set(doc["paths"])
    # the contract's routes are all there
    for method, path in [
        ("get", "/api/health"), ("get", "/api/openapi.json"), ("post", "/api/agents"),
        ("put", "/api/agents/{agent_id}"), ("get", "/api/agents"), ("get", "/api/agents/{agent_id}"),
        ("post", "/api/sessions"), ("get", "/api/sessions"), ("get", "/api/sessions/{session_id}"),
        ("patch", "/api/sessions/{session_id}"), ("delete", "/api/sessions/{session_id}"),
        ("get", "/api/sessions/{session_id}/messages"), ("post", "/api/sessions/{session_id}/messages"),
        ("get", "/api/agent-runs/{run_id}"), ("get", "/api/agent-runs"),
        ("get", "/api/agent-runs/{run_id}/events"), ("post", "/api/agent-runs/{run_id}/cancel"),
        ("get", "/api/agent-runs/{run_id}/tree"), ("get", "/api/messages/{message_id}/provenance"),
        ("post", "/api/executor/claim"), ("post", "/api/executor/runs/{run_id}/heartbeat"),
        ("post", "/api/executor/runs/{run_id}/events"), ("post", "/api/executor/runs/{run_id}/children"),
    ]:
        assert (method, path) in documented, (method, path)


def test_the_document_is_well_formed(doc):
    assert doc["openapi"].startswith("3.")
    assert doc["info"]["title"] and doc["info"]["version"]
    operation_ids = []
    for path, item in doc["paths"].items():
        assert path.startswith("/api")
        names = re.findall(r"{([a-z_]+)}", path)
        for method, op in item.items():
            assert method in HTTP_METHODS
            operation_ids.append(op["operationId"])
            assert op["summary"] and op["responses"]
            assert any(code.startswith("2") for code in op["responses"]), (method, path)
            params = op.get("parameters", [])
            assert sorted(p["name"] for p in params if p["in"] == "path") == sorted(names)
            for code, response in op["responses"].items():
                assert re.fullmatch(r"[1-5]\d\d", code) and response["description"]
                for media in response.get("content", {}).values():
                    _check_refs(media["schema"], doc)
            if "requestBody" in op:
                _check_refs(op["requestBody"]["content"]["application/json"]["schema"], doc)
            if op["security"]:
                assert {"401", "403"} <= set(op["responses"]), (method, path)
    assert len(operation_ids) == len(set(operation_ids))
    assert doc["paths"]["/api/health"]["get"]["security"] == []
    events = doc["paths"]["/api/agent-runs/{run_id}/events"]["get"]
    assert "text/event-stream" in events["responses"]["200"]["content"]
    assert {p["name"] for p in events["parameters"]} >= {"run_id", "after_seq", "limit", "Last-Event-ID"}
    post = doc["paths"]["/api/sessions/{session_id}/messages"]["post"]
    assert "Idempotency-Key" in {p["name"] for p in post["parameters"]}
    assert "202" in post["responses"]
    assert set(doc["components"]["securitySchemes"]) == {"bearer", "cookie"}


def test_the_document_passes_an_openapi_validator(doc):
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(doc)


def _check_refs(node, doc):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref is not None:
            assert ref.startswith("#/components/schemas/"), ref
            assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"], ref
        for value in node.values():
            _check_refs(value, doc)
    elif isinstance(node, list):
        for value in node:
            _check_refs(value, doc)


# ---- real responses against the documented schemas ---------------------------------------------


class RecordingHttp(FlaskHttp):
    def __init__(self, client):
        super().__init__(client)
        self.seen: list[tuple[str, str, Reply]] = []

    def request(self, method, path, **kwargs):
        reply = super().request(method, path, **kwargs)
        self.seen.append((method, path, reply))
        return reply


def _scenario(api, http):
    """Every route, successes and refusals, through ``http``."""
    create_agent(http, api.admin, "helper", name="Helper")
    http.request("PUT", "/api/agents/helper", token=api.admin, json={"name": "Helper 2", "kind": "echo"})
    http.request("GET", "/api/agents", token=api.alice)
    http.request("GET", "/api/agents/helper", token=api.alice)
    http.request("POST", "/api/agents", token=api.admin, json={"id": "helper", "name": "x", "kind": "echo"})
    http.request("GET", "/api/health")
    chat = open_session(http, api.alice, "helper", title="doc")["id"]
    http.request("PATCH", f"/api/sessions/{chat}", token=api.alice, json={"title": "doc 2"})
    http.request("GET", "/api/sessions", token=api.alice)
    http.request("GET", f"/api/sessions/{chat}", token=api.alice)
    posted, answer_id = answer(http, api.alice, api.executor, chat, "q")
    key = unique()
    send(http, api.alice, chat, "dup", key=key)
    send(http, api.alice, chat, "dup", key=key)
    send(http, api.alice, chat, "other", key=key, expect=409)
    send(http, api.alice, chat, "x", agent_id="ghost", expect=422)
    http.request("POST", f"/api/sessions/{chat}/messages", token=api.alice, json={"content": "k"})
    http.request("GET", f"/api/sessions/{chat}/messages", token=api.alice)
    run = posted["run_id"]
    http.request("GET", f"/api/agent-runs/{run}", token=api.alice)
    http.request("GET", "/api/agent-runs", token=api.viewer, query={"status": "succeeded"})
    http.request("GET", f"/api/agent-runs/{run}/events", token=api.alice)
    http.request("GET", f"/api/agent-runs/{run}/tree", token=api.alice)
    http.request("GET", f"/api/messages/{answer_id}/provenance", token=api.alice)
    http.request("GET", f"/api/messages/{posted['message_id']}/provenance", token=api.alice)
    http.request("POST", f"/api/agent-runs/{run}/cancel", token=api.alice)
    live = post_message(http, api.alice, open_session(http, api.alice)["id"], "live")["run_id"]
    inst = unique("e")
    claim_run(http, api.executor, live, inst)
    http.request("POST", f"/api/executor/runs/{live}/heartbeat", token=api.executor,
                 json={"executor_instance_id": inst})
    http.request("POST", f"/api/executor/runs/{live}/heartbeat", token=api.executor,
                 json={"executor_instance_id": "intruder"})
    http.request("POST", f"/api/executor/runs/{live}/children", token=api.executor,
                 json={"executor_instance_id": inst, "agent_id": "echo", "input": "sub"})
    append(http, api.executor, live, inst, [("message.delta", {"text": "x"})])
    append(http, api.executor, live, inst, [("run.started", {"executor_instance_id": "x"})])
    http.request("POST", f"/api/agent-runs/{live}/cancel", token=api.alice)
    append(http, api.executor, live, inst, [("run.completed", {})])
    http.request("GET", "/api/sessions", token=None)
    http.request("GET", "/api/sessions", token=api.executor)
    http.request("GET", "/api/sessions", token=api.alice, query={"limit": 0})
    http.request("POST", "/api/sessions", token=api.alice, data=b"{oops")
    http.request("POST", "/api/sessions", token=api.alice, data=b"x" * (2 * 1024 * 1024))
    http.request("GET", "/api/agent-runs/run_missing", token=api.alice)
    http.request("DELETE", f"/api/sessions/{chat}", token=api.alice)
    http.request("GET", f"/api/agent-runs/{run}/events", token=api.alice,
                 headers={"Accept": "text/event-stream", "Last-Event-ID": "999"})


def test_real_responses_match_the_documented_schemas(api, doc):
    jsonschema = pytest.importorskip("jsonschema")
    http = RecordingHttp(api.app.test_client())
    _scenario(api, http)
    adapter = api.app.url_map.bind("localhost")
    statuses = set()
    for method, path, reply in http.seen:
        rule, _ = adapter.match(path.split("?")[0], method=method, return_rule=True)
        op = doc["paths"][_openapi_path(rule.rule)][method.lower()]
        documented = op["responses"].get(str(reply.status))
        assert documented is not None, f"{method} {path} answered {reply.status}, undocumented"
        statuses.add(reply.status)
        if reply.status == 204:
            assert reply.body == b"" and "content" not in documented
            continue
        schema = documented["content"]["application/json"]["schema"]
        if not schema:
            continue
        root = {**schema, "components": doc["components"]}
        jsonschema.Draft202012Validator(root).validate(reply.json())
    assert {200, 201, 202, 204, 400, 401, 403, 404, 409, 413, 422} <= statuses


def test_real_responses_fit_the_pydantic_response_models(api):
    """The same check without jsonschema: the models the document is generated from."""
    http = RecordingHttp(api.app.test_client())
    _scenario(api, http)
    models = {}
    from agentledger.api import api as registry

    for op in registry.operations:
        models[(op.method, op.path)] = op.responses
    adapter = api.app.url_map.bind("localhost")
    checked = 0
    for method, path, reply in http.seen:
        rule, _ = adapter.match(path.split("?")[0], method=method, return_rule=True)
        if reply.status >= 400:
            responses.ErrorResponse.model_validate_json(reply.body)
            checked += 1
            continue
        model = models[(method, rule.rule)].get(reply.status)
        if model is not None:
            model.model_validate_json(reply.body)
            checked += 1
    assert checked > 40
