"""Owner isolation and role checks (the guarantees table, docs/guarantees.md: "authz" and "mass assignment").

The authz matrix is generated, not listed by hand: every operation of ``/api/openapi.json`` (plus
the SSE form of the events route) and every Dash callback of the app's callback map, × the
callers {anonymous, owner A, owner B, viewer, executor, admin}, × the objects {A's, B's, A's child
run, nonexistent} (for routes with an object in their path). The expected answer comes from the
document's ``x-roles`` and the rules of CONTRACT §5/§6:

- no ``x-roles`` (public) → 2xx;
- anonymous → 401; a role not in ``x-roles`` → 403;
- a nonexistent object → 404; another owner's session, run or message for a ``user`` → 404;
- otherwise "allowed": a status the operation documents that is not 401/403/404, and 2xx for
  every ``GET`` (the unsafe routes meet terminal runs, so ``cancel``/executor writes answer their
  documented 409: the role and owner checks passed, the state machine refused);
- Dash callbacks: anonymous → 401, user/executor → 403, viewer/admin → 200/204.

An ``executor`` reads only what following its delegated children needs: any run
(``GET /api/agent-runs/{id}``) and its events (JSON and SSE), besides the agent catalogue and
its own routes; ``test_an_executor_reads_runs_and_their_events_and_nothing_else`` pins that
list, and the matrix checks that it may read the runs of every owner.

Mass assignment: bodies carrying fields the server owns are refused with 422 and nothing is
written; free-form event ``data`` naming ``seq``/``owner_id``/``status`` is stored as data and
changes nothing of the run.
"""

from __future__ import annotations

import itertools
import json

import pytest
from sqlalchemy import select
from support.api import (
    FlaskHttp,
    append,
    claim_run,
    ledger_state,
    make_tokens,
    open_session,
    post_message,
    unique,
)
from support.dashboards import csrf_headers, dash_request, logged_in
from support.factories import make_agent, make_session

from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.schema import AgentRun, ChatSession, Message, RunEvent

IDENTITIES = {
    "anonymous": None,
    "owner_a": ("alice", "user"),
    "owner_b": ("bob", "user"),
    "viewer": ("auditor", "viewer"),
    "executor": ("exec-svc", "executor"),
    "admin": ("root", "admin"),
}
TARGETS = ("a", "b", "a_child", "none")
OWNED = {"run_id", "session_id", "message_id"}
OWNER_OF = {"a": "owner_a", "a_child": "owner_a", "b": "owner_b"}
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def world(module_db_url):
    """The app (API + dashboards) and the objects of the matrix, built once per module."""
    from agentledger.app_factory import create_app

    db = Database(module_db_url)
    settings = Settings(database_url=module_db_url, secret_key="authz-tests", run_rate_limit=0)
    app = create_app(settings, database=db)
    http = FlaskHttp(app.test_client())
    make_agent(db, "echo", name="Echo")
    tokens = make_tokens(db, {k: v for k, v in IDENTITIES.items() if v})
    ex, inst = tokens["executor"], unique("matrix-exec")

    def finished_run(user: str) -> tuple[str, str, str]:
        session = open_session(http, tokens[user])["id"]
        run = post_message(http, tokens[user], session, "question")["run_id"]
        claim_run(http, ex, run, inst)
        return session, run, inst

    sa, ra, _ = finished_run("owner_a")
    child = http.request("POST", f"/api/executor/runs/{ra}/children", token=ex,
                         json={"executor_instance_id": inst, "agent_id": "echo", "input": "sub"})
    assert child.status == 201, child
    ca = child.json()["run_id"]
    claim_run(http, ex, ca, inst)
    for run in (ca, ra):
        done = append(http, ex, run, inst, [("message.delta", {"text": "ok"}), ("run.completed", {})])
        assert done.status == 200, done
    sb, rb, _ = finished_run("owner_b")
    assert append(http, ex, rb, inst, [("run.completed", {})]).status == 200

    def final(run):
        return http.request("GET", f"/api/agent-runs/{run}", token=tokens["admin"]).json()[
            "final_message_id"]

    objects = {
        "run_id": {"a": ra, "b": rb, "a_child": ca, "none": "run_01nonexistent0000000000"},
        "session_id": {"a": sa, "b": sb, "none": "sess_01nonexistent000000000"},
        "message_id": {"a": final(ra), "b": final(rb), "a_child": final(ca),
                       "none": "msg_01nonexistent0000000000"},
        "agent_id": {"a": "echo", "none": "no-such-agent"},
    }
    assert all(objects["message_id"].values())
    yield {"db": db, "app": app, "http": http, "tokens": tokens, "objects": objects}
    app.extensions["agentledger"].close()
    db.dispose()


# ---- the API matrix ---------------------------------------------------------------------------


def _body(method: str, path: str):
    """A valid body for each unsafe operation (the matrix checks access, not validation). An
    operation missing here fails the test, so new routes cannot slip past."""
    n = next(_ids)
    return {
        ("POST", "/api/agents"): {"id": f"matrix-agent-{n}", "name": "M", "kind": "echo"},
        ("PUT", "/api/agents/{agent_id}"): {"name": "Echo", "kind": "echo"},
        ("POST", "/api/sessions"): {"agent_id": "echo"},
        ("PATCH", "/api/sessions/{session_id}"): {"title": f"renamed {n}"},
        ("POST", "/api/sessions/{session_id}/messages"): {"content": "matrix"},
        ("POST", "/api/executor/claim"): {"executor_instance_id": "matrix", "max_runs": 1},
        ("POST", "/api/executor/runs/{run_id}/heartbeat"): {"executor_instance_id": "matrix"},
        ("POST", "/api/executor/runs/{run_id}/events"): {
            "executor_instance_id": "matrix",
            "events": [{"type": "message.delta", "data": {"text": "x"}}]},
        ("POST", "/api/executor/runs/{run_id}/children"): {
            "executor_instance_id": "matrix", "agent_id": "echo", "input": "x"},
        ("POST", "/api/otel/v1/traces"): {"resourceSpans": []},  # an empty OTLP JSON export
        **{("POST", f"/api/executor/runs/{{run_id}}/{operation}"): {
            "executor_instance_id": "matrix", **body} for operation, body in MEMORY_BODIES.items()},
    }[(method, path)]


# The memory routes of a run (its thread's LangGraph checkpoints and Agents SDK session).
MEMORY_BODIES = {
    "checkpoints/get": {}, "checkpoints/list": {},
    "checkpoints/put": {"checkpoint": {"type": "null", "data": ""}},
    "checkpoints/put-writes": {"checkpoint_id": "c", "task_id": "t", "writes": [
        {"channel": "x", "value": {"type": "null", "data": ""}}]},
    "session/get-items": {}, "session/add-items": {"items": [{"role": "user", "content": "x"}]},
    "session/pop-item": {}, "session/clear": {},
}


def _expected(op: dict, path_params: list[str], identity: str, target: str | None) -> str:
    roles = op.get("x-roles")
    if roles is None:
        return "ok"
    if identity == "anonymous":
        return "401"
    if IDENTITIES[identity][1] not in roles:
        return "403"
    if target == "none":
        return "404"
    if (IDENTITIES[identity][1] == "user" and target is not None
            and OWNED & set(path_params) and OWNER_OF[target] != identity):
        return "404"
    return "ok"


def _classify(status: int, method: str, op: dict) -> str:
    if status in (401, 403, 404):
        return str(status)
    documented = {int(code) for code in op["responses"]}
    if status not in documented or status >= 500:
        return f"undocumented {status}"
    if method == "GET" and not 200 <= status < 300:
        return f"GET answered {status}"
    return "ok"


def _cells(world):
    spec = world["http"].request("GET", "/api/openapi.json").json()
    for path, item in spec["paths"].items():
        for method, op in item.items():
            params = [p["name"] for p in op.get("parameters", []) if p["in"] == "path"]
            forms = ["json"] + (["sse"] if "text/event-stream" in str(op["responses"]) else [])
            targets: tuple = (None,)
            if params:
                [param] = params
                targets = tuple(t for t in TARGETS if t in world["objects"][param])
            for form, identity, target in itertools.product(forms, IDENTITIES, targets):
                yield path, method.upper(), op, params, form, identity, target


def test_api_matrix_matches_the_documented_table(world):
    http, tokens, objects, db = world["http"], world["tokens"], world["objects"], world["db"]
    mismatches, counted = [], 0
    for path, method, op, params, form, identity, target in _cells(world):
        url = path
        if params:
            value = objects[params[0]][target]
            if method == "DELETE" and params[0] == "session_id" and target in OWNER_OF:
                # deleting is final: each cell deletes a fresh session of the same owner
                value = make_session(db, owner=IDENTITIES[OWNER_OF[target]][0])
            url = path.replace("{" + params[0] + "}", value)
        headers = {"Accept": "text/event-stream"} if form == "sse" else {}
        if method == "POST" and path.endswith("/messages"):
            headers["Idempotency-Key"] = unique("matrix")
        kwargs = {"json": _body(method, path)} if "requestBody" in op else {}
        reply = http.request(method, url, token=tokens.get(identity), headers=headers, **kwargs)
        got = _classify(reply.status, method, op)
        want = _expected(op, params, identity, target)
        if form == "sse" and want == "ok" and reply.status == 200:
            body = reply.text
            got = "ok" if "event: run.completed" in body and body.count("id: ") >= 3 else "bad sse"
        counted += 1
        if got != want:
            mismatches.append((method, path, form, identity, target, want, got, reply.body[:120]))
    print(f"[authz api {db.dialect}] {counted} cells, {len(mismatches)} mismatches")
    assert counted > 300
    assert mismatches == []


EXECUTOR_OPERATIONS = {
    ("GET", "/api/agent-runs/{run_id}"), ("GET", "/api/agent-runs/{run_id}/events"),
    ("POST", "/api/otel/v1/traces"),  # executors may record runs from traces (CONTRACT §8)
    ("POST", "/api/executor/claim"), ("POST", "/api/executor/runs/{run_id}/heartbeat"),
    ("POST", "/api/executor/runs/{run_id}/events"), ("POST", "/api/executor/runs/{run_id}/children"),
    *(("POST", f"/api/executor/runs/{{run_id}}/{operation}") for operation in MEMORY_BODIES),
}


def test_an_executor_reads_runs_and_their_events_and_nothing_else(world):
    spec = world["http"].request("GET", "/api/openapi.json").json()
    allowed = {(method.upper(), path) for path, item in spec["paths"].items()
               for method, op in item.items() if "executor" in (op.get("x-roles") or ())}
    assert allowed == EXECUTOR_OPERATIONS
    http, ex, objects = world["http"], world["tokens"]["executor"], world["objects"]
    # any owner's run, a child included, as JSON and as a stream
    for target in ("a", "b", "a_child"):
        run_id = objects["run_id"][target]
        assert http.request("GET", f"/api/agent-runs/{run_id}", token=ex).json()["id"] == run_id
        page = http.request("GET", f"/api/agent-runs/{run_id}/events", token=ex).json()
        assert page["terminal"] is True and page["events"][-1]["type"] == "run.completed"
    for path in ("/api/agent-runs", "/api/sessions", f"/api/agent-runs/{objects['run_id']['a']}/tree",
                 f"/api/messages/{objects['message_id']['a']}/provenance",
                 f"/api/sessions/{objects['session_id']['a']}/messages"):
        assert http.request("GET", path, token=ex).status == 403, path


# ---- the Dash matrix --------------------------------------------------------------------------


def _outputs(key: str) -> list[tuple[str, str]]:
    parts = key.strip(".").split("...") if key.startswith("..") else [key]
    return [(_sent_id(i), prop) for i, prop in (p.rsplit(".", 1) for p in parts)]


def _changed_id(sent) -> str:
    """How the renderer names a component in ``changedPropIds``: a pattern id as compact JSON
    with sorted keys."""
    return sent if isinstance(sent, str) else json.dumps(sent, sort_keys=True,
                                                         separators=(",", ":"))


def _sent_id(declared: str):
    """The id the renderer sends for a declared one: a pattern id (JSON with a MATCH wildcard,
    the event logs') as the object of one concrete component, any other id as it is."""
    if not declared.startswith("{"):
        return declared
    return {k: "message" if v == ["MATCH"] else v for k, v in json.loads(declared).items()}


def test_dash_callback_matrix_matches_the_documented_table(world):
    app, tokens, objects = world["app"], world["tokens"], world["objects"]
    callbacks = app.extensions["agentledger_dash"].callback_map
    clients = {name: (logged_in(app, tokens[name]) if name != "anonymous" else app.test_client())
               for name in IDENTITIES}
    mismatches, counted = [], 0
    for key, spec in callbacks.items():
        if "callback" not in spec:
            continue  # a clientside callback (Dash's page router): nothing runs on the server
        object_inputs = [i["id"] for i in spec["inputs"] if i["id"] in ("run-id", "message-id")]
        kind = {"run-id": "run_id", "message-id": "message_id"}.get(
            object_inputs[0] if object_inputs else "", None)
        targets = tuple(t for t in TARGETS if t in objects[kind]) if kind else (None,)
        for identity, target in itertools.product(IDENTITIES, targets):
            value = objects[kind][target] if kind else None
            # what the browser sends for a location: a path, an empty query; else None
            defaults = {"pathname": "/", "search": "", "hash": "", "href": "http://x/"}
            inputs = [(_sent_id(i["id"]), i["property"], value if i["id"] in object_inputs
                       else defaults.get(i["property"])) for i in spec["inputs"]]
            state = [(_sent_id(i["id"]), i["property"], None) for i in spec.get("state", [])]
            body = dash_request(_outputs(key), inputs, state,
                                changed=[f"{_changed_id(i[0])}.{i[1]}" for i in inputs[:1]])
            body["output"] = key  # the renderer names a callback by its declared outputs
            client = clients[identity]
            reply = client.post("/_dash-update-component", json=body,
                                headers=csrf_headers(client))
            role = IDENTITIES[identity][1] if IDENTITIES[identity] else None
            want = ("401" if role is None else "allowed" if role in ("viewer", "admin") else "403")
            got = ("allowed" if reply.status_code in (200, 204) else str(reply.status_code))
            counted += 1
            if got != want:
                mismatches.append((key[:60], identity, target, want, got, reply.data[:160]))
    print(f"[authz dash {world['db'].dialect}] {len(callbacks)} callbacks, {counted} cells, "
          f"{len(mismatches)} mismatches")
    assert mismatches == []


# ---- mass assignment --------------------------------------------------------------------------


def _run_row(db: Database, run_id: str) -> tuple:
    with db.read() as s:
        r = s.get(AgentRun, run_id)
        return (r.owner_id, r.status, r.session_id, r.thread_id, r.parent_run_id, r.root_run_id,
                r.last_event_seq, r.executor_instance_id, r.lease_expires_at, r.final_message_id)


FOREIGN = {"owner_id": "bob", "status": "succeeded", "seq": 99, "last_event_seq": 99,
           "lease_expires_at": "2099-01-01T00:00:00+00:00", "thread_id": "thr_01forged",
           "parent_run_id": None, "root_run_id": "run_01forged", "session_id": None,
           "id": "sess_01forged", "run_id": "run_01forged", "created_at": "2000-01-01T00:00:00Z",
           "deleted_at": "2000-01-01T00:00:00Z", "executor_instance_id": "evil",
           "final_message_id": "msg_01forged", "version": 7, "content_hash": "0" * 64,
           "role": "assistant"}


def test_mass_assignment_is_refused_or_ignored(world):
    http, tokens, objects, db = world["http"], world["tokens"], world["objects"], world["db"]
    alice, admin, ex = tokens["owner_a"], tokens["admin"], tokens["executor"]
    foreign = dict(FOREIGN, parent_run_id=objects["run_id"]["b"], session_id=objects["session_id"]["b"])
    session = open_session(http, alice, title="mass")
    posted = post_message(http, alice, session["id"], "mass")
    run = posted["run_id"]
    inst = unique("mass-exec")
    claim_run(http, ex, run, inst, lease_seconds=600)  # outlives ~180 requests on a busy machine

    cases = [
        ("POST", "/api/sessions", alice, {"agent_id": "echo"}, {}),
        ("PATCH", f"/api/sessions/{session['id']}", alice, {"title": "t"}, {}),
        ("POST", f"/api/sessions/{session['id']}/messages", alice, {"content": "x"},
         {"Idempotency-Key": "mass"}),
        ("POST", "/api/agents", admin, {"id": "mass-agent", "name": "M", "kind": "echo"}, {}),
        ("PUT", "/api/agents/echo", admin, {"name": "Echo", "kind": "echo"}, {}),
        ("POST", "/api/executor/claim", ex, {"executor_instance_id": inst}, {}),
        ("POST", f"/api/executor/runs/{run}/heartbeat", ex, {"executor_instance_id": inst}, {}),
        ("POST", f"/api/executor/runs/{run}/events", ex,
         {"executor_instance_id": inst, "events": [{"type": "message.delta", "data": {"text": "x"}}]},
         {}),
        ("POST", f"/api/executor/runs/{run}/children", ex,
         {"executor_instance_id": inst, "agent_id": "echo", "input": "x"}, {}),
    ]
    refused = attempts = 0
    for method, path, token, base, headers in cases:
        for name, value in foreign.items():
            if name in base:
                continue
            before = (ledger_state(db, run), _run_row(db, run), _session_row(db, session["id"]))
            reply = http.request(method, path, token=token, json={**base, name: value},
                                 headers=headers)
            attempts += 1
            assert reply.status == 422, (method, path, name, reply)
            assert reply.json()["error"]["code"] == "validation_error"
            after = (ledger_state(db, run), _run_row(db, run), _session_row(db, session["id"]))
            assert after == before, (method, path, name)
            refused += 1
    # nested: an event object carrying seq / created_at is refused too
    for name in ("seq", "created_at", "run_id", "hash"):
        before = _run_row(db, run)
        reply = http.request("POST", f"/api/executor/runs/{run}/events", token=ex, json={
            "executor_instance_id": inst,
            "events": [{"type": "message.delta", "data": {"text": "x"}, name: 99}]})
        attempts += 1
        assert reply.status == 422 and _run_row(db, run) == before, (name, reply)
        refused += 1
    # free-form event data naming server-owned fields is only data
    before = _run_row(db, run)
    reply = http.request("POST", f"/api/executor/runs/{run}/events", token=ex, json={
        "executor_instance_id": inst,
        "events": [{"type": "message.delta", "data": {"text": "x", **{
            k: v for k, v in foreign.items() if k != "text"}}}]})
    attempts += 1
    if reply.status == 200:
        [seq] = reply.json()["seqs"]
        assert seq == before[6] + 1
        after = _run_row(db, run)
        assert after[:6] == before[:6] and after[7:] == before[7:] and after[6] == seq
        with db.read() as s:
            stored = s.execute(select(RunEvent.seq, RunEvent.run_id).where(
                RunEvent.run_id == run).order_by(RunEvent.seq)).all()
        assert [r.seq for r in stored] == list(range(1, seq + 1))
    else:
        assert reply.status == 422 and _run_row(db, run) == before, reply
    refused += 1  # refused or ignored
    with db.read() as s:
        assert s.execute(select(Message).where(Message.id == "msg_01forged")).first() is None
        assert s.get(ChatSession, "sess_01forged") is None
        assert s.get(AgentRun, "run_01forged") is None
    print(f"[mass assignment {db.dialect}] {refused}/{attempts} refused or ignored")
    assert refused == attempts


def _session_row(db: Database, session_id: str) -> tuple:
    with db.read() as s:
        row = s.get(ChatSession, session_id)
        return (row.owner_id, row.agent_id, row.title, row.thread_id, row.deleted_at)
