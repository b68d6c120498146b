"""CONTRACT §5 error codes through the Flask test client, on SQLite and PostgreSQL.

Every error is exactly ``{"error": {"code", "message"}}``; each test sends the input that
causes one code and, where the request would write, checks that nothing was written.
"""

from __future__ import annotations

import base64
import json
import re

import pytest
from support.api import (
    answer,
    assert_envelope,
    assert_error,
    ledger_state,
    open_session,
    post_message,
    row_counts,
    send,
    unique,
)

from agentledger.api import api as registry
from agentledger.core.json_limits import MAX_JSON_DEPTH
from ingest.tokens import revoke_token


def _concrete(path: str) -> str:
    """A registry path (``/api/sessions/<session_id>``) with placeholder ids filled in."""
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", lambda m: f"{m.group(1)}_x", path)


AUTHENTICATED = [op for op in registry.operations if op.roles is not None]
OPEN = [op for op in registry.operations if op.roles is None]
FORBIDDEN_PAIRS = [
    (op, role)
    for op in AUTHENTICATED
    for role in ("user", "viewer", "executor", "admin")
    if role not in op.roles
]
ROLE_TOKEN = {"user": "alice", "viewer": "viewer", "executor": "executor", "admin": "admin"}


@pytest.fixture
def chat(api):
    return open_session(api, api.alice, title="alice's chat")["id"]


# ---- health, 404/405, the envelope itself ------------------------------------------------------


def test_health_needs_no_token_and_names_the_database(api, db_url):
    reply = api.get("/api/health")
    assert reply.status == 200
    assert reply.json() == {"status": "ok",
                            "database": "sqlite" if db_url.startswith("sqlite") else "postgresql"}


@pytest.mark.parametrize("method,path", [
    ("GET", "/api/nope"), ("GET", "/api"), ("POST", "/api/sessions/x/y/z"), ("GET", "/api/agents/a/b"),
])
def test_unknown_api_route_is_a_json_404(api, method, path):
    assert_error(api.request(method, path, token=api.admin), 404, "not_found")


@pytest.mark.parametrize("method,path", [
    ("DELETE", "/api/agents"), ("PUT", "/api/sessions"), ("POST", "/api/health"),
    ("DELETE", "/api/agent-runs/run_x"), ("PATCH", "/api/executor/claim"),
    ("GET", "/api/agent-runs/run_x/cancel"),
])
def test_method_not_allowed_is_the_json_envelope(api, method, path):
    reply = api.request(method, path, token=api.admin)
    assert reply.status == 405
    assert assert_envelope(reply)["code"] == "method_not_allowed"
    assert reply.headers.get("Allow")


def test_an_unexpected_failure_is_a_500_envelope_without_internals(api, monkeypatch, caplog):
    import agentledger.api.routes_sessions as routes

    def boom(*args, **kwargs):
        raise RuntimeError("secret-internal-detail")

    monkeypatch.setattr(routes, "list_sessions", boom)
    reply = api.get("/api/sessions", api.alice)
    assert_error(reply, 500, "internal_error")
    assert b"secret-internal-detail" not in reply.body and b"Traceback" not in reply.body


# ---- 401 unauthenticated -----------------------------------------------------------------------


@pytest.mark.parametrize("op", AUTHENTICATED, ids=lambda op: f"{op.method} {op.path}")
def test_every_authenticated_route_refuses_a_request_without_token(api, op):
    reply = api.request(op.method, _concrete(op.path), json={})
    assert_error(reply, 401, "unauthenticated")


@pytest.mark.parametrize("op", OPEN, ids=lambda op: f"{op.method} {op.path}")
def test_open_routes_need_no_token(api, op):
    assert api.request(op.method, op.path).status == 200


@pytest.mark.parametrize("header", [
    "Bearer al_not-a-real-token", "Bearer ", "Bearer", "Basic YWxpY2U6c2VjcmV0", "al_no_scheme",
    "Token al_x",
])
def test_bad_tokens_are_401(api, header):
    reply = api.request("GET", "/api/sessions", headers={"Authorization": header})
    assert_error(reply, 401, "unauthenticated")


def test_a_revoked_token_is_401(api, db):
    reply = api.get("/api/sessions", api.alice)
    assert reply.status == 200
    from sqlalchemy import select

    from agentledger.core.hashing import token_hash
    from agentledger.core.schema import ApiToken

    with db.read() as s:
        token_id = s.execute(
            select(ApiToken.id).where(ApiToken.token_hash == token_hash(api.alice))
        ).scalar_one()
    with db.write() as s:
        revoke_token(s, token_id)
    assert_error(api.get("/api/sessions", api.alice), 401, "unauthenticated")


# ---- 403 forbidden -----------------------------------------------------------------------------


@pytest.mark.parametrize("op,role", FORBIDDEN_PAIRS,
                         ids=lambda v: v if isinstance(v, str) else f"{v.method} {v.path}")
def test_every_route_refuses_the_roles_it_does_not_allow(api, op, role):
    before = row_counts(api.db)
    reply = api.request(op.method, _concrete(op.path), token=getattr(api, ROLE_TOKEN[role]), json={})
    assert_error(reply, 403, "forbidden")
    assert row_counts(api.db) == before


def test_the_contracts_named_role_refusals(api, chat):
    # viewer posting a message; user registering an agent; user claiming runs as an executor
    before = row_counts(api.db)
    assert_error(send(api, api.viewer, chat, "hi", expect=None), 403, "forbidden")
    assert_error(api.post("/api/agents", api.alice, json={"id": "mine", "name": "Mine", "kind": "echo"}),
                 403, "forbidden")
    assert_error(api.post("/api/executor/claim", api.alice, json={"executor_instance_id": "x"}),
                 403, "forbidden")
    assert_error(api.request("PUT", "/api/agents/echo", token=api.alice,
                             json={"name": "Hijacked", "kind": "echo"}), 403, "forbidden")
    assert_error(api.get("/api/sessions", api.executor), 403, "forbidden")
    assert row_counts(api.db) == before


# ---- 400 invalid_request -----------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"{not json", b'{"content": "hi"', b"\xff\xfe", b"   ", b"",
                                 b"{'content': 'single quotes'}", b"NaN-ish"])
def test_malformed_json_is_400_invalid_request(api, chat, raw):
    before = row_counts(api.db)
    reply = api.post(f"/api/sessions/{chat}/messages", api.alice, data=raw,
                     headers={"Idempotency-Key": unique()})
    assert_error(reply, 400, "invalid_request")
    assert_error(api.post("/api/sessions", api.alice, data=raw), 400, "invalid_request")
    assert row_counts(api.db) == before


def test_a_number_too_long_to_read_is_400_in_words_about_the_body(api, chat):
    # Python's guard spoke of itself: "use sys.set_int_max_str_digits() to increase the limit".
    before = row_counts(api.db)
    reply = api.post(f"/api/sessions/{chat}/messages", api.alice,
                     data=b'{"content": "hi", "n": ' + b"7" * 5_000 + b"}",
                     headers={"Idempotency-Key": unique()})
    assert_error(reply, 400, "invalid_request")
    assert reply.json()["error"]["message"] == "the body holds a number of more than 4300 digits"
    assert row_counts(api.db) == before


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 3_000, 50_000])
def test_a_body_nested_too_deeply_is_400_invalid_request(api, chat, depth):
    """Deep nesting, a few KB of brackets, would exhaust the recursion of whatever reads it."""
    nested = "[" * depth + "]" * depth
    before = row_counts(api.db)
    reply = api.post(f"/api/sessions/{chat}/messages", api.alice,
                     data=f'{{"content": "hi", "context": {nested}}}'.encode(),
                     headers={"Idempotency-Key": unique()})
    assert_error(reply, 400, "invalid_request")
    assert "nests deeper than" in reply.json()["error"]["message"]
    agent = f'{{"id": "deep-{depth}", "name": "D", "kind": "echo", "params": {{"x": {nested}}}}}'
    assert_error(api.post("/api/agents", api.admin, data=agent.encode()), 400, "invalid_request")
    assert row_counts(api.db) == before


def test_a_body_nested_to_the_limit_is_read(api):
    nested = "[" * (MAX_JSON_DEPTH - 2) + "]" * (MAX_JSON_DEPTH - 2)
    body = f'{{"id": "deep-ok", "name": "D", "kind": "echo", "params": {{"x": {nested}}}}}'
    reply = api.post("/api/agents", api.admin, data=body.encode())
    assert reply.status == 201, reply


@pytest.mark.parametrize("raw", [b"[]", b'["content"]', b'"hello"', b"42", b"null", b"true"])
def test_a_body_that_is_not_an_object_is_400_invalid_request(api, chat, raw):
    before = row_counts(api.db)
    reply = api.post(f"/api/sessions/{chat}/messages", api.alice, data=raw,
                     headers={"Idempotency-Key": unique()})
    assert_error(reply, 400, "invalid_request")
    assert row_counts(api.db) == before


@pytest.mark.parametrize("path", ["/api/sessions", "/api/agents", "/api/agent-runs",
                                  "/api/sessions/{chat}/messages", "/api/agent-runs/{run}/events"])
def test_list_limits_out_of_range_are_400(api, chat, path):
    run = post_message(api, api.alice, chat)["run_id"]
    url = path.format(chat=chat, run=run)
    for limit in ("0", "501", "-1", "abc", "1.5", "1e3"):
        assert_error(api.get(url, api.admin, query={"limit": limit}), 400, "invalid_request")
    for ok in ("1", "500"):
        assert api.get(url, api.admin, query={"limit": ok}).status == 200


def _cursor(values) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


BAD_CURSORS = ["garbage!!", "%%%", _cursor([]), _cursor({"a": 1}), _cursor([None]),
               _cursor([{"a": 1}]), _cursor([1, 2, 3, 4]), _cursor("x"),
               _cursor(["2026-01-01T00:00:00+00:00", ["x"]]),
               _cursor(["2026-01-01T00:00:00+00:00", None]),
               _cursor(["not a time", "x"]), _cursor(["2026-01-01T00:00:00", "x"]),
               # a time with no UTC equivalent, and ids no database stores (each size a list
               # takes: one for the agents, two for the others)
               _cursor(["0001-01-01T00:00:00+14:00", "run_x"]),
               _cursor(["2026-01-01T00:00:00+00:00", "\ud800"]), _cursor(["\ud800"]),
               _cursor(["2026-01-01T00:00:00+00:00", "a\x00b"]), _cursor(["a\x00b"])]


@pytest.mark.parametrize("path", ["/api/sessions", "/api/agents", "/api/agent-runs",
                                  "/api/sessions/{chat}/messages"])
def test_a_cursor_this_server_did_not_make_is_400(api, chat, path):
    # (crafted cursors with nulls or nested values used to reach the SQL and fail with a 500)
    post_message(api, api.alice, chat)
    for cursor in BAD_CURSORS:
        assert_error(api.get(path.format(chat=chat), api.admin, query={"cursor": cursor}),
                     400, "invalid_request")


@pytest.mark.parametrize("query", [{"status": "done"}, {"created_after": "yesterday"},
                                   {"created_before": "2026-01-01T00:00:00"},
                                   {"after_seq": "-1"}])
def test_bad_filters_are_400(api, query):
    path = "/api/agent-runs" if "after_seq" not in query else None
    if path is None:
        chat = open_session(api, api.alice)["id"]
        path = f"/api/agent-runs/{post_message(api, api.alice, chat)['run_id']}/events"
    assert_error(api.get(path, api.admin, query=query), 400, "invalid_request")


LIST_ROUTES = ["/api/sessions", "/api/agents", "/api/agent-runs", "/api/sessions/{chat}/messages",
               "/api/agent-runs/{run}/events", "/api/admin-actions", "/api/overview",
               "/api/messages", "/api/timeline", "/api/interrupted-runs", "/api/leases",
               "/api/agent-outcomes"]


@pytest.mark.parametrize("path", LIST_ROUTES)
def test_a_query_parameter_a_route_does_not_take_or_given_twice_is_400(api, chat, path):
    # (both used to be ignored: a misspelt or misplaced filter answered with everything)
    run = post_message(api, api.alice, chat)["run_id"]
    url = path.format(chat=chat, run=run)
    name, value, other = ("window", "24h", "7d") if path == "/api/overview" else ("limit", 5, 6)
    assert api.get(f"{url}?{name}={value}", api.admin).status == 200
    error = assert_error(api.get(f"{url}?{name}={value}&colour=red", api.admin),
                         400, "invalid_request")
    assert "'colour'" in error["message"] and name in error["message"], error
    error = assert_error(api.get(f"{url}?{name}={value}&{name}={other}", api.admin),
                         400, "invalid_request")
    assert f"'{name}'" in error["message"] and "2 times" in error["message"], error


def test_a_filter_of_another_list_is_refused_not_answered_with_everything(api, chat):
    post_message(api, api.alice, chat)
    error = assert_error(api.get("/api/interrupted-runs?created_after=2026-01-01T00:00:00Z",
                                 api.admin), 400, "invalid_request")
    assert "interrupted_after" in error["message"], error
    assert_error(api.get("/api/agent-runs?status=queued&status=running", api.admin),
                 400, "invalid_request")


def test_missing_idempotency_key_is_400_and_writes_nothing(api, chat):
    before = row_counts(api.db)
    url = f"/api/sessions/{chat}/messages"
    assert_error(api.post(url, api.alice, json={"content": "hi"}), 400, "idempotency_key_required")
    for bad in ["", "x" * 256, "tab\tinside", "caf\u00e9"]:
        try:
            reply = api.post(url, api.alice, json={"content": "hi"}, headers={"Idempotency-Key": bad})
        except ValueError:  # the client itself refuses to send some header values
            continue
        assert_error(reply, 400, "idempotency_key_required")
    assert row_counts(api.db) == before
    # the boundaries are accepted
    assert send(api, api.alice, chat, "hi", key="k" * 255).status == 202
    assert send(api, api.alice, chat, "hi", key="!").status == 202
    # Printable characters beyond ASCII, sent as UTF-8 (here as the latin-1 text of those bytes,
    # which is how a WSGI server hands them over): the key is "clé-€", 255 of them at most.
    sent_as = "clé-€".encode().decode("latin-1")
    first = send(api, api.alice, chat, "hi", key=sent_as)
    again = send(api, api.alice, chat, "hi", key=sent_as)
    assert first.json()["run_id"] == again.json()["run_id"]  # a replay: the same run
    assert send(api, api.alice, chat, "hi", key=("é" * 255).encode().decode("latin-1")).status == 202
    for bad in ["é" * 256, "\x85", "\u2028"]:  # too long; not printable, as UTF-8
        reply = api.post(url, api.alice, json={"content": "hi"},
                         headers={"Idempotency-Key": bad.encode().decode("latin-1")})
        assert_error(reply, 400, "idempotency_key_required")


@pytest.mark.parametrize("last_id", ["abc", "-1", "2147483648", "194082554612"])
def test_invalid_last_event_id_is_400(api, chat, last_id):
    run = post_message(api, api.alice, chat)["run_id"]
    reply = api.get(f"/api/agent-runs/{run}/events", api.alice,
                    headers={"Accept": "text/event-stream", "Last-Event-ID": last_id})
    assert_error(reply, 400, "invalid_request")


# ---- 413 payload_too_large ---------------------------------------------------------------------


@pytest.mark.parametrize("route", ["messages", "sessions", "agents", "executor_events"])
def test_a_2mb_body_is_413_and_writes_nothing(api, chat, route):
    big = b'{"content": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    path, token = {
        "messages": (f"/api/sessions/{chat}/messages", api.alice),
        "sessions": ("/api/sessions", api.alice),
        "agents": ("/api/agents", api.admin),
        "executor_events": ("/api/executor/runs/run_x/events", api.executor),
    }[route]
    before = row_counts(api.db)
    reply = api.post(path, token, data=big, headers={"Idempotency-Key": unique()})
    assert_error(reply, 413, "payload_too_large")
    assert row_counts(api.db) == before


# ---- 422 validation_error / unknown_agent ------------------------------------------------------


@pytest.mark.parametrize("body", [
    {},
    {"content": 5},
    {"content": None},
    {"content": ["hi"]},
    {"content": {"text": "hi"}},
    {"content": ""},
    {"content": "x" * 32_001},
    {"content": "hi", "owner_id": "bob"},
    {"content": "hi", "status": "succeeded"},
    {"content": "hi", "run_id": "run_x"},
    {"content": "hi", "thread_id": "thr_x"},
    {"content": "hi", "agent_id": "Not A Slug"},
    {"content": "hi", "agent_id": 7},
    {"content": "hi", "context": "doc"},
    {"content": "hi", "context": [{"id": "a"}]},
    {"content": "hi", "context": [{"id": "a", "title": "t", "content": "c", "sha256": "f"}]},
    {"content": "nul\x00inside"},
], ids=lambda b: repr(b)[:60])
def test_invalid_message_bodies_are_422_and_write_nothing(api, chat, body):
    before = row_counts(api.db)
    reply = api.post(f"/api/sessions/{chat}/messages", api.alice, json=body,
                     headers={"Idempotency-Key": unique()})
    assert_error(reply, 422, "validation_error")
    assert row_counts(api.db) == before


def test_content_of_exactly_32000_characters_is_accepted(api, chat):
    reply = send(api, api.alice, chat, "y" * 32_000)
    assert reply.status == 202


def test_a_text_beyond_its_length_is_measured_in_characters(api, chat):
    # pydantic said "Value should have at most 500 items after validation, not 501".
    reply = api.post("/api/sessions", api.alice, json={"agent_id": "echo", "title": "t" * 501})
    assert_error(reply, 422, "validation_error")
    assert reply.json()["error"]["message"] == "title: should have at most 500 characters, not 501"
    reply = api.get("/api/messages", api.viewer, query={"q": "q" * 201})
    assert_error(reply, 400, "invalid_request")
    assert reply.json()["error"]["message"] == "query: q: should have at most 200 characters, not 201"


@pytest.mark.parametrize("path,body", [
    ("/api/sessions", {}),
    ("/api/sessions", {"agent_id": 5}),
    ("/api/sessions", {"agent_id": "echo", "title": 7}),
    ("/api/sessions", {"agent_id": "echo", "owner_id": "bob"}),
    ("/api/sessions", {"agent_id": "echo", "thread_id": "thr_x"}),
    ("/api/sessions", {"agent_id": "echo", "title": "t" * 501}),
    ("/api/agents", {"id": "Bad Id!", "name": "x", "kind": "echo"}),
    ("/api/agents", {"id": "ok", "kind": "echo"}),
    ("/api/agents", {"id": "ok", "name": "", "kind": "echo"}),
    ("/api/agents", {"id": "ok", "name": "x", "kind": "no-such-kind"}),
    ("/api/agents", {"id": "ok", "name": "x", "kind": "scripted", "params": {"steps": [{"bogus": 1}]}}),
    ("/api/agents", {"id": "ok", "name": "x", "kind": "echo", "tools": "all"}),
    ("/api/agents", {"id": "ok", "name": "x", "kind": "echo", "version": 9}),
    ("/api/executor/claim", {}),
    ("/api/executor/claim", {"executor_instance_id": "x", "max_runs": 0}),
    ("/api/executor/claim", {"executor_instance_id": "x", "lease_seconds": 0.5}),
    ("/api/executor/claim", {"executor_instance_id": "x", "lease_seconds": 99999}),
], ids=lambda v: v if isinstance(v, str) else repr(v)[:50])
def test_invalid_bodies_on_other_routes_are_422(api, path, body):
    token = api.admin if path == "/api/agents" else api.executor if "executor" in path else api.alice
    before = row_counts(api.db)
    assert_error(api.post(path, token, json=body), 422, "validation_error")
    assert row_counts(api.db) == before


def test_patch_session_validation(api, chat):
    url = f"/api/sessions/{chat}"
    for body in ({"agent_id": None}, {"title": 5}, {"owner_id": "bob"}, {"deleted_at": None}):
        assert_error(api.request("PATCH", url, token=api.alice, json=body), 422, "validation_error")
    assert api.get(url, api.alice).json()["agent_id"] == "echo"


def test_unknown_agents_are_422_unknown_agent(api, chat):
    before = row_counts(api.db)
    assert_error(api.post("/api/sessions", api.alice, json={"agent_id": "ghost"}), 422, "unknown_agent")
    assert_error(send(api, api.alice, chat, "hi", agent_id="ghost", expect=None), 422, "unknown_agent")
    assert_error(api.request("PATCH", f"/api/sessions/{chat}", token=api.alice,
                             json={"agent_id": "ghost"}), 422, "unknown_agent")
    assert row_counts(api.db) == before
    assert api.get(f"/api/sessions/{chat}", api.alice).json()["agent_id"] == "echo"


def test_an_agent_recorded_from_traces_takes_no_sessions_or_messages(api, chat):
    """Kind ``external`` runs elsewhere (its runs come from OTLP traces): a session for it, or a
    message to it, was accepted and its run waited until an executor failed it
    ``unknown_agent_kind``. Now it is refused up front and nothing is written."""
    assert api.post("/api/agents", api.admin, json={"id": "traced", "name": "Traced",
                                                     "kind": "external"}).status == 201
    before = row_counts(api.db)
    for reply in (api.post("/api/sessions", api.alice, json={"agent_id": "traced"}),
                  send(api, api.alice, chat, "hi", agent_id="traced", expect=None),
                  api.request("PATCH", f"/api/sessions/{chat}", token=api.alice,
                              json={"agent_id": "traced"})):
        assert_error(reply, 422, "validation_error")
        assert "'traced' is of kind 'external'" in reply.json()["error"]["message"]
    assert row_counts(api.db) == before
    assert api.get(f"/api/sessions/{chat}", api.alice).json()["agent_id"] == "echo"


# ---- 404 not_found: unknown ids, and another owner's objects -----------------------------------


@pytest.mark.parametrize("method,path,token,body", [
    ("GET", "/api/sessions/sess_nope", "alice", None),
    ("PATCH", "/api/sessions/sess_nope", "alice", {"title": "x"}),
    ("DELETE", "/api/sessions/sess_nope", "alice", None),
    ("GET", "/api/sessions/sess_nope/messages", "alice", None),
    ("POST", "/api/sessions/sess_nope/messages", "alice", {"content": "hi"}),
    ("GET", "/api/agent-runs/run_nope", "admin", None),
    ("GET", "/api/agent-runs/run_nope/events", "admin", None),
    ("POST", "/api/agent-runs/run_nope/cancel", "admin", None),
    ("GET", "/api/agent-runs/run_nope/tree", "viewer", None),
    ("GET", "/api/messages/msg_nope/provenance", "viewer", None),
    ("GET", "/api/agents/nope", "alice", None),
    ("PUT", "/api/agents/nope", "admin", {"name": "Nope", "kind": "echo"}),
    ("POST", "/api/executor/runs/run_nope/heartbeat", "executor", {"executor_instance_id": "e"}),
    ("POST", "/api/executor/runs/run_nope/events", "executor",
     {"executor_instance_id": "e", "events": [{"type": "message.delta", "data": {"text": "x"}}]}),
    ("POST", "/api/executor/runs/run_nope/children", "executor",
     {"executor_instance_id": "e", "agent_id": "echo", "input": "x"}),
], ids=lambda v: v if isinstance(v, str) else None)
def test_unknown_ids_are_404(api, method, path, token, body):
    kwargs = {"json": body} if body is not None else {}
    before = row_counts(api.db)
    reply = api.request(method, path, token=getattr(api, token),
                        headers={"Idempotency-Key": unique()}, **kwargs)
    assert_error(reply, 404, "not_found")
    assert row_counts(api.db) == before


def test_another_owners_session_run_and_messages_are_404_never_403(api, chat):
    posted, answer_id = answer(api, api.alice, api.executor, chat, "secret question")
    running = post_message(api, api.alice, chat, "second")  # queued: cancellable if it leaked
    run, user_msg = posted["run_id"], posted["message_id"]
    before = ledger_state(api.db, running["run_id"])
    bob = api.bob

    for method, path, body in [
        ("GET", f"/api/sessions/{chat}", None),
        ("PATCH", f"/api/sessions/{chat}", {"title": "mine now"}),
        ("DELETE", f"/api/sessions/{chat}", None),
        ("GET", f"/api/sessions/{chat}/messages", None),
        ("POST", f"/api/sessions/{chat}/messages", {"content": "hi"}),
        ("GET", f"/api/agent-runs/{run}", None),
        ("GET", f"/api/agent-runs/{run}/events", None),
        ("GET", f"/api/agent-runs/{run}/tree", None),
        ("POST", f"/api/agent-runs/{running['run_id']}/cancel", None),
        ("POST", f"/api/agent-runs/{run}/cancel", None),
        ("GET", f"/api/messages/{answer_id}/provenance", None),
        ("GET", f"/api/messages/{user_msg}/provenance", None),  # 404, not 422: nothing leaks
    ]:
        kwargs = {"json": body} if body is not None else {}
        reply = api.request(method, path, token=bob, headers={"Idempotency-Key": unique()}, **kwargs)
        assert_error(reply, 404, "not_found")
    sse = api.get(f"/api/agent-runs/{run}/events", bob, headers={"Accept": "text/event-stream"})
    assert_error(sse, 404, "not_found")

    assert api.get("/api/sessions", bob).json()["items"] == []
    assert api.get("/api/agent-runs", bob).json()["items"] == []
    assert api.get("/api/agent-runs", bob, query={"session_id": chat}).json()["items"] == []
    assert ledger_state(api.db, running["run_id"]) == before
    assert api.get(f"/api/sessions/{chat}", api.alice).json()["title"] == "alice's chat"


# ---- 409 and 422 of runs and provenance --------------------------------------------------------


def test_provenance_of_a_user_message_is_422(api, chat):
    posted, _ = answer(api, api.alice, api.executor, chat)
    for token in (api.alice, api.viewer, api.admin):
        assert_error(api.get(f"/api/messages/{posted['message_id']}/provenance", token),
                     422, "not_an_assistant_message")


def test_cancel_of_a_terminal_run_is_409_run_terminal(api, chat):
    posted, _ = answer(api, api.alice, api.executor, chat)
    before = ledger_state(api.db, posted["run_id"])
    reply = api.post(f"/api/agent-runs/{posted['run_id']}/cancel", api.alice)
    assert_error(reply, 409, "run_terminal")
    assert ledger_state(api.db, posted["run_id"]) == before


# ---- the login cookie --------------------------------------------------------------------------


def test_login_link_sets_a_cookie_that_authenticates_api_calls(api, chat):
    browser = api.app.test_client()
    assert_error(_reply(browser.get("/api/sessions")), 401, "unauthenticated")
    login = browser.get("/login", query_string={"token": api.alice})
    assert login.status_code in (302, 303)
    cookie = next(c for c in login.headers.getlist("Set-Cookie")
                  if c.startswith("agentledger_session="))
    assert "HttpOnly" in cookie
    assert api.alice not in cookie  # the token itself never goes into the cookie
    login.close()

    listed = _reply(browser.get("/api/sessions"))
    assert listed.status == 200 and [s["id"] for s in listed.json()["items"]] == [chat]
    # unsafe requests on a cookie session need the CSRF header, as Dash's renderer sends it
    refused = _reply(browser.post(f"/api/sessions/{chat}/messages", json={"content": "forged"},
                                  headers={"Idempotency-Key": unique()}))
    assert_error(refused, 403, "forbidden")
    posted = _reply(browser.post(f"/api/sessions/{chat}/messages", json={"content": "via cookie"},
                                 headers={"Idempotency-Key": unique(),
                                          "X-CSRFToken": browser.get_cookie("_csrf_token").value}))
    assert posted.status == 202
    assert posted.json()["run_id"].startswith("run_")

    browser.get("/logout").close()
    assert_error(_reply(browser.get("/api/sessions")), 401, "unauthenticated")


def test_login_with_a_bad_token_sets_no_cookie(api):
    browser = api.app.test_client()
    reply = browser.get("/login", query_string={"token": "al_wrong"})
    assert reply.status_code == 401 and "Set-Cookie" not in reply.headers
    reply.close()
    assert_error(_reply(browser.get("/api/sessions")), 401, "unauthenticated")


def test_a_viewer_cookie_keeps_the_viewer_role(api, chat):
    browser = api.app.test_client()
    browser.get("/login", query_string={"token": api.viewer}).close()
    assert _reply(browser.get(f"/api/sessions/{chat}")).status == 200
    assert_error(_reply(browser.post(f"/api/sessions/{chat}/messages", json={"content": "x"},
                                     headers={"Idempotency-Key": unique()})), 403, "forbidden")


def _reply(response):
    from support.api import Reply

    try:
        return Reply(response.status_code, response.headers, response.get_data())
    finally:
        response.close()


# ---- bounds and strict formats (found by schemathesis) ----------------------------------------


@pytest.mark.parametrize("after_seq", ["194082554612", "2147483648", str(2**63), "-1"])
def test_an_after_seq_beyond_what_a_seq_column_holds_is_400_not_500(api, after_seq):
    """``after_seq=194082554612`` was a 500 on PostgreSQL (integer out of range)."""
    run = post_message(api, api.alice, open_session(api, api.alice)["id"], "x")["run_id"]
    reply = api.get(f"/api/agent-runs/{run}/events", api.alice, query={"after_seq": after_seq})
    assert_error(reply, 400, "invalid_request")


def test_the_largest_seq_a_column_holds_is_accepted(api):
    run = post_message(api, api.alice, open_session(api, api.alice)["id"], "x")["run_id"]
    reply = api.get(f"/api/agent-runs/{run}/events", api.alice, query={"after_seq": 2**31 - 1})
    assert reply.status == 200 and reply.json()["events"] == []


@pytest.mark.parametrize("path, name", [
    ("/api/agent-runs", "created_before"), ("/api/agent-runs", "created_after"),
    ("/api/admin-actions", "since"), ("/api/admin-actions", "until"),
])
@pytest.mark.parametrize("value", ["0.5", "0", "1700000000", "2026-01-31", "2026-01-31T12:00:00",
                                   "yesterday", "0001-01-01T00:00:00+14:00"])
def test_date_time_parameters_are_strict_iso_8601_with_an_offset(api, path, name, value):
    assert_error(api.get(path, api.admin, query={name: value}), 400, "invalid_request")


@pytest.mark.parametrize("value", ["2026-01-31T12:00:00Z", "2026-01-31T12:00:00.5+02:00",
                                   "2026-01-31t12:00z"])
def test_iso_8601_date_times_with_an_offset_are_accepted(api, value):
    for path, name in (("/api/agent-runs", "created_before"), ("/api/admin-actions", "until")):
        assert api.get(path, api.admin, query={name: value}).status == 200, (path, value)
