"""Agent kinds (CONTRACT §5): ``echo``, every ``scripted`` step, plug-ins through the
``agentledger.agent_kinds`` entry-point group, and validation of definitions at registration.

Unit tests drive a kind with a recording port; the rest run real executors against both
databases and read what was stored.
"""

from __future__ import annotations

import sys
import textwrap
import time

import pytest
from support.factories import make_agent, make_session, post
from support.processes import (
    ExecutorPool,
    assert_one_terminal_event,
    events,
    message_content,
    run,
    runs,
    status,
    types,
    wait_for_status,
    wait_terminal,
    wait_until,
)

from agentledger import agent_kinds
from agentledger.agent_kinds import AgentFailed, RunContext, available_kinds, kind_for
from agentledger.app_factory import create_app
from agentledger.core.config import Settings
from agentledger.core.hashing import sha256_hex, snapshot_sha256
from ingest.cancel import request_cancel
from ingest.tokens import create_token


@pytest.fixture
def executors(db):
    with ExecutorPool(db) as pool:
        yield pool


# --------------------------------------------------------------------------------------------
# the kinds themselves, with a recording port (no database)
# --------------------------------------------------------------------------------------------


class RecordingPort:
    def __init__(self):
        self.calls: list[tuple] = []

    def emit(self, run_id, event_type, data):
        self.calls.append(("emit", event_type, data))

    def sleep(self, run_id, seconds):
        self.calls.append(("sleep", seconds))

    def delegate(self, run_id, children):
        self.calls.append(("delegate", children))
        return [{"run_id": f"run_child{i}", "status": "succeeded", "final_message_id": None}
                for i, _ in enumerate(children)]


def _ctx(steps=None, *, kind="scripted", input="the refund policy") -> tuple[RunContext, RecordingPort]:
    port = RecordingPort()
    snapshot = {"agent_id": "a", "name": "A", "version": 1, "kind": kind,
                "params": {"steps": steps} if steps is not None else {}}
    ctx = RunContext(run_id="run_x", thread_id="thr_x", input=input, agent_execution_snapshot=snapshot,
                     context_pack_snapshot={"items": []}, context=[], port=port)
    return ctx, port


def test_echo_says_the_input_once():
    ctx, port = _ctx(kind="echo", input="ping 42")
    assert kind_for("echo")(ctx) is None
    assert port.calls == [("emit", "message.delta", {"text": "ping 42"})]
    assert ctx.answer_parts == ["ping 42"]


def test_scripted_runs_every_step_kind_in_order_with_input_substitution():
    steps = [
        {"say": "Looking into {input}. "},
        {"tool": "search", "input": {"q": "refunds"}, "output": {"hits": 3}},
        {"usage": {"input_tokens": 120, "output_tokens": 30, "cost_usd": 0.0021}},
        {"sleep": 0.25},
        {"delegate": [{"agent_id": "helper", "input": "check {input}"}, {"agent_id": "other"}]},
        {"say": "Done."},
    ]
    ctx, port = _ctx(steps)
    assert kind_for("scripted")(ctx) is None
    assert port.calls == [
        ("emit", "message.delta", {"text": "Looking into the refund policy. "}),
        ("emit", "tool.call", {"name": "search", "input": {"q": "refunds"}}),
        ("emit", "tool.result", {"name": "search", "output": {"hits": 3}}),
        ("emit", "usage", {"input_tokens": 120, "output_tokens": 30, "cost_usd": 0.0021}),
        ("sleep", 0.25),
        ("delegate", [{"agent_id": "helper", "input": "check the refund policy"},
                      {"agent_id": "other", "input": "the refund policy"}]),
        ("emit", "message.delta", {"text": "Done."}),
    ]
    assert "".join(ctx.answer_parts) == "Looking into the refund policy. Done."


def test_scripted_fail_stops_the_script_with_agent_error():
    ctx, port = _ctx([{"say": "a"}, {"fail": "could not reach {input}"}, {"say": "never"}])
    with pytest.raises(AgentFailed) as raised:
        kind_for("scripted")(ctx)
    assert raised.value.code == "agent_error"
    assert raised.value.message == "could not reach {input}"  # fail text is taken literally
    assert port.calls == [("emit", "message.delta", {"text": "a"})]


def test_scripted_without_steps_does_nothing():
    ctx, port = _ctx(None)
    assert kind_for("scripted")(ctx) is None
    assert port.calls == []


# --------------------------------------------------------------------------------------------
# the kinds run by a real executor, on both databases
# --------------------------------------------------------------------------------------------


def test_echo_run_answers_with_the_input(db, executors):
    make_agent(db, "echo")
    posted = post(db, make_session(db), "echo me: ünïcødé ✓")
    executors.start()
    wait_for_status(db, posted.run_id, "succeeded")
    assert types(db, posted.run_id) == ["run.queued", "run.started", "message.delta",
                                        "run.completed"]
    row = run(db, posted.run_id)
    assert message_content(db, row.final_message_id) == "echo me: ünïcødé ✓"
    assert events(db, posted.run_id)[-1].data["final_message_id"] == row.final_message_id


def test_scripted_run_stores_every_step_and_completes_with_the_accumulated_answer(db, executors):
    make_agent(db, "helper", kind="echo")
    make_agent(db, "scripty", kind="scripted", params={"steps": [
        {"say": "Hello {input}! "},
        {"tool": "lookup", "input": {"id": 7}, "output": {"found": True}},
        {"usage": {"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.5}},
        {"sleep": 0.1},
        {"delegate": [{"agent_id": "helper", "input": "sub {input}"}]},
        {"say": "Bye."},
    ]})
    posted = post(db, make_session(db, agent_id="scripty"), "world")
    executors.start()
    wait_for_status(db, posted.run_id, "succeeded")
    evs = events(db, posted.run_id)
    assert [e.type for e in evs] == [
        "run.queued", "run.started", "message.delta", "tool.call", "tool.result", "usage",
        "run.child_created", "run.child_finished", "message.delta", "run.completed",
    ]
    assert evs[2].data["text"] == "Hello world! "
    assert evs[3].data == {"name": "lookup", "input": {"id": 7}}
    assert evs[4].data == {"name": "lookup", "output": {"found": True}}
    assert evs[5].data == {"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.5}
    child_id = evs[6].data["child_run_id"]
    assert evs[6].data["agent_id"] == "helper"
    assert evs[7].data == {"child_run_id": child_id, "status": "succeeded"}
    assert message_content(db, run(db, posted.run_id).final_message_id) == "Hello world! Bye."
    assert run(db, child_id).input == "sub world"
    assert message_content(db, run(db, child_id).final_message_id) == "sub world"
    assert_one_terminal_event(db, posted.run_id)


def test_scripted_fail_ends_the_run_failed_with_agent_error(db, executors):
    make_agent(db, "flaky", kind="scripted", params={"steps": [
        {"say": "partial "}, {"fail": "upstream said no"}, {"say": "never said"}]})
    posted = post(db, make_session(db, agent_id="flaky"), "x")
    executors.start()
    wait_for_status(db, posted.run_id, "failed")
    row = run(db, posted.run_id)
    assert row.error == {"code": "agent_error", "message": "upstream said no"}
    assert row.final_message_id is None
    assert types(db, posted.run_id) == ["run.queued", "run.started", "message.delta", "run.failed"]
    assert events(db, posted.run_id)[-1].data["error"] == row.error


def test_sleep_step_notices_a_cancel_instead_of_sleeping_on(db, executors):
    make_agent(db, "sleeper", kind="scripted",
               params={"steps": [{"say": "zz"}, {"sleep": 3600}, {"say": "woke"}]})
    posted = post(db, make_session(db, agent_id="sleeper"), "x")
    executors.start()
    wait_for_status(db, posted.run_id, "running", timeout=60)
    wait_until(lambda: "message.delta" in types(db, posted.run_id), timeout=60)
    asked = time.monotonic()
    with db.write() as s:
        assert request_cancel(s, posted.run_id, requested_by="alice") == "cancelling"
    # An hour-long sleep ends cancelled: the step noticed the cancel instead of sleeping on (the
    # deadline only stops a hang; the contract's "within 1 s" is reported, not judged).
    wait_for_status(db, posted.run_id, "cancelled", timeout=60)
    print(f"cancel noticed by a sleep step after {time.monotonic() - asked:.2f}s")
    evs = events(db, posted.run_id)
    assert [e.type for e in evs] == ["run.queued", "run.started", "message.delta",
                                     "run.cancelling", "run.cancelled"]
    assert evs[-1].data["external_stop_confirmed"] is True


def test_delegate_creates_children_on_their_own_threads_running_in_parallel(db, executors):
    make_agent(db, "child-a", kind="scripted", params={"steps": [{"sleep": 1}, {"say": "A:{input}"}]})
    make_agent(db, "child-b", kind="scripted", params={"steps": [{"sleep": 1}, {"say": "B:{input}"}]})
    make_agent(db, "boss", kind="scripted", params={"steps": [
        {"say": "Plan for {input}. "},
        {"delegate": [{"agent_id": "child-a", "input": "part one of {input}"},
                      {"agent_id": "child-b"}]},
        {"say": "Done."},
    ]})
    session_id = make_session(db, agent_id="boss")
    posted = post(db, session_id, "topic")
    executors.start(concurrency=3)
    wait_for_status(db, posted.run_id, "succeeded", timeout=60)

    parent = run(db, posted.run_id)
    children = runs(db, parent_run_id=parent.id)
    assert [c.agent_id for c in children] == ["child-a", "child-b"]
    assert [c.input for c in children] == ["part one of topic", "topic"]
    threads = {parent.thread_id}
    for child in children:
        assert child.session_id is None
        assert child.parent_run_id == parent.id
        assert child.root_run_id == parent.id
        assert child.owner_id == parent.owner_id
        assert child.status == "succeeded"
        assert child.thread_id not in threads  # each child has its own new thread
        threads.add(child.thread_id)
        assert_one_terminal_event(db, child.id)
        assert events(db, child.id)[0].data == {
            "agent_id": child.agent_id, "session_id": None, "parent_run_id": parent.id,
            "input_sha256": sha256_hex(child.input),
            "agent_snapshot_sha256": snapshot_sha256(child.agent_execution_snapshot),
            "context_pack_sha256": snapshot_sha256(child.context_pack_snapshot)}
    # parallel: the two one-second children overlap in time
    a, b = children
    assert a.started_at < b.finished_at and b.started_at < a.finished_at

    evs = events(db, parent.id)
    created = [e.data for e in evs if e.type == "run.child_created"]
    finished = [e.data for e in evs if e.type == "run.child_finished"]
    assert created == [{"child_run_id": c.id, "agent_id": c.agent_id} for c in children]
    assert sorted(f["child_run_id"] for f in finished) == sorted(c.id for c in children)
    assert all(f["status"] == "succeeded" for f in finished)
    kinds = [e.type for e in evs]
    assert kinds.index("run.child_finished") > max(i for i, t in enumerate(kinds)
                                                   if t == "run.child_created")
    assert message_content(db, parent.final_message_id) == "Plan for topic. Done."
    assert message_content(db, children[0].final_message_id) == "A:part one of topic"
    assert_one_terminal_event(db, parent.id)


def test_delegating_to_an_unregistered_agent_fails_the_parent_cleanly(db, executors):
    # Steps are validated for shape at registration; whether the agent exists is known only
    # when the run delegates, and then the parent must fail, not hang until its lease expires.
    make_agent(db, "lonely", kind="scripted", params={"steps": [
        {"say": "trying"}, {"delegate": [{"agent_id": "nobody-home"}]}, {"say": "never"}]})
    posted = post(db, make_session(db, agent_id="lonely"), "x")
    executors.start()
    wait_for_status(db, posted.run_id, ("failed", "interrupted"), timeout=60)
    row = run(db, posted.run_id)
    assert row.status == "failed"
    assert row.error["code"] == "unknown_agent"
    assert "nobody-home" in row.error["message"]
    assert runs(db, parent_run_id=posted.run_id) == []  # no half-created children
    assert_one_terminal_event(db, posted.run_id)


def test_unknown_kind_fails_the_run_cleanly_and_the_executor_carries_on(db, executors):
    # Registered through ingest directly: as if a plug-in was uninstalled after registration.
    make_agent(db, "ghost", kind="uninstalled-plugin")
    make_agent(db, "echo")
    session_id = make_session(db, agent_id="ghost")
    ghost = post(db, session_id, "boo")
    after = post(db, session_id, "still here", agent_id="echo")
    executors.start(concurrency=1)
    wait_terminal(db, [ghost.run_id, after.run_id])
    row = run(db, ghost.run_id)
    assert row.status == "failed"
    assert row.error["code"] == "unknown_agent_kind"
    assert "uninstalled-plugin" in row.error["message"]
    assert types(db, ghost.run_id) == ["run.queued", "run.started", "run.failed"]
    assert status(db, after.run_id) == "succeeded"


# --------------------------------------------------------------------------------------------
# plug-ins: the agentledger.agent_kinds entry-point group
# --------------------------------------------------------------------------------------------

PLUGIN_MODULE = "agentledger_test_plugin"


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed distribution (dist-info on sys.path) that registers three kinds."""
    root = tmp_path / "site"
    root.mkdir()
    (root / f"{PLUGIN_MODULE}.py").write_text(textwrap.dedent("""
        from agentledger.agent_kinds import AgentFailed

        def shout(ctx):
            ctx.say(ctx.input.upper())
            ctx.emit("usage", {"input_tokens": len(ctx.input), "output_tokens": 1, "cost_usd": 0.0})
            return ctx.input.upper() + "!"

        def broken(ctx):
            raise RuntimeError("boom")

        def refusing(ctx):
            raise AgentFailed("quota exhausted", code="quota")

        def sloppy(ctx):
            ctx.say("counting")
            ctx.emit("usage", {"input_tokens": -5, "output_tokens": 1, "cost_usd": 0.0})
            return "never"

        def impostor(ctx):
            return "not the built-in echo"

        def quits(ctx):
            ctx.say("leaving")
            raise SystemExit("bye")

        def rambles(ctx):
            raise RuntimeError("on and on " * 2_000)

        def garbles(ctx):
            raise AgentFailed("bad \\x00 byte and \\ud800 half", code="garbled")
    """))
    dist = root / "agentledger_test_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: agentledger-test-plugin\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(f"""
        [agentledger.agent_kinds]
        shout = {PLUGIN_MODULE}:shout
        broken = {PLUGIN_MODULE}:broken
        refusing = {PLUGIN_MODULE}:refusing
        sloppy = {PLUGIN_MODULE}:sloppy
        echo = {PLUGIN_MODULE}:impostor
        quits = {PLUGIN_MODULE}:quits
        rambles = {PLUGIN_MODULE}:rambles
        garbles = {PLUGIN_MODULE}:garbles
    """))
    monkeypatch.syspath_prepend(str(root))
    available_kinds.cache_clear()
    yield
    available_kinds.cache_clear()
    sys.modules.pop(PLUGIN_MODULE, None)


def test_entry_point_kinds_are_discovered_and_cannot_replace_built_ins(plugin):
    kinds = available_kinds()
    assert {"echo", "scripted", "shout", "broken", "refusing"} <= set(kinds)
    assert kinds["echo"] is agent_kinds.BUILT_IN["echo"]  # built-ins win over a plug-in name
    assert kind_for("shout").__module__ == PLUGIN_MODULE
    agent_kinds.validate_definition("shout", {})  # a plug-in kind is a valid kind
    assert kind_for("not-installed") is None


def test_without_plugins_only_built_ins_are_known():
    available_kinds.cache_clear()
    try:
        assert {"echo", "scripted"} <= set(available_kinds())
        assert "shout" not in available_kinds()
    finally:
        available_kinds.cache_clear()


def test_plugin_kinds_run_through_the_executor(db, executors, plugin):
    for agent_id in ("shout", "broken", "refusing", "sloppy", "echo"):
        make_agent(db, f"a-{agent_id}", kind=agent_id)
    session_id = make_session(db, agent_id="a-shout")
    shout = post(db, session_id, "quiet words")
    broken = post(db, make_session(db, agent_id="a-broken"), "x")
    refusing = post(db, make_session(db, agent_id="a-refusing"), "x")
    sloppy = post(db, make_session(db, agent_id="a-sloppy"), "x")
    echo = post(db, make_session(db, agent_id="a-echo"), "plain")
    executors.start()
    wait_terminal(db, [shout.run_id, broken.run_id, refusing.run_id, sloppy.run_id, echo.run_id])

    row = run(db, shout.run_id)
    assert row.status == "succeeded"
    # a returned string is the answer; the deltas are still the run's progress events
    assert message_content(db, row.final_message_id) == "QUIET WORDS!"
    assert types(db, shout.run_id) == ["run.queued", "run.started", "message.delta", "usage",
                                       "run.completed"]
    row = run(db, broken.run_id)
    assert row.status == "failed"
    assert row.error == {"code": "agent_exception", "message": "RuntimeError: boom"}
    assert run(db, refusing.run_id).error == {"code": "quota", "message": "quota exhausted"}
    # an event the ledger refuses (negative tokens) is not written; the run fails with the reason
    row = run(db, sloppy.run_id)
    assert row.status == "failed"
    assert row.error["code"] == "validation_error"
    assert types(db, sloppy.run_id) == ["run.queued", "run.started", "message.delta", "run.failed"]
    assert message_content(db, run(db, echo.run_id).final_message_id) == "plain"
    for posted in (shout, broken, refusing, sloppy, echo):
        assert_one_terminal_event(db, posted.run_id)


def test_an_error_no_run_could_hold_is_cut_or_mended_and_the_run_fails(db, executors, plugin):
    """An exception's text over 10,000 characters, or with a NUL or a lone surrogate, made the
    run.failed write refused: the run stayed running until its lease ran out."""
    make_agent(db, "a-rambles", kind="rambles")
    make_agent(db, "a-garbles", kind="garbles")
    rambles = post(db, make_session(db, agent_id="a-rambles"), "x")
    garbles = post(db, make_session(db, agent_id="a-garbles"), "x")
    executors.start()
    wait_terminal(db, [rambles.run_id, garbles.run_id], timeout=10)
    error = run(db, rambles.run_id).error
    assert error["code"] == "agent_exception" and len(error["message"]) == 10_000
    assert error["message"].startswith("RuntimeError: on and on on and on")
    assert error["message"].endswith(" … (cut: 20,014 characters in all)")
    assert run(db, garbles.run_id).error == {"code": "garbled",
                                              "message": "bad \ufffd byte and \ufffd half"}
    for posted in (rambles, garbles):
        assert run(db, posted.run_id).status == "failed"
        assert_one_terminal_event(db, posted.run_id)


def test_a_plugin_kind_that_exits_fails_its_run_and_the_executor_goes_on(db, executors, plugin):
    # ``sys.exit()`` in a run's thread is the agent's, not the worker's exit: the run fails at
    # once with the code the executor gives any exception a kind lets through.
    make_agent(db, "a-quits", kind="quits")
    make_agent(db, "a-echo", kind="echo")
    quits = post(db, make_session(db, agent_id="a-quits"), "x")
    executors.start(concurrency=1)
    wait_terminal(db, quits.run_id, timeout=10)
    row = run(db, quits.run_id)
    assert row.status == "failed"
    assert row.error == {"code": "agent_exception", "message": "SystemExit: bye"}
    assert types(db, quits.run_id) == ["run.queued", "run.started", "message.delta", "run.failed"]
    echo = post(db, make_session(db, agent_id="a-echo"), "still serving")
    wait_terminal(db, echo.run_id, timeout=10)
    assert message_content(db, run(db, echo.run_id).final_message_id) == "still serving"


# --------------------------------------------------------------------------------------------
# registration validation through the HTTP API (Flask test client)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def admin_client(db):
    app = create_app(Settings(database_url=db.url, secret_key="test"), database=db,
                     dashboards=False)
    with db.write() as s:
        _, token = create_token(s, owner_id="root", role="admin")
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    yield client
    app.extensions["agentledger"].close()


BAD_DEFINITIONS = {
    "unknown kind": {"kind": "telepathy"},
    "steps not a list": {"params": {"steps": {"say": "hi"}}},
    "step not an object": {"params": {"steps": ["say hi"]}},
    "unknown step": {"params": {"steps": [{"dance": 3}]}},
    "two actions in one step": {"params": {"steps": [{"say": "a", "sleep": 1}]}},
    "say not text": {"params": {"steps": [{"say": 42}]}},
    "fail not text": {"params": {"steps": [{"fail": {"why": "x"}}]}},
    "negative sleep": {"params": {"steps": [{"sleep": -1}]}},
    "sleep as text": {"params": {"steps": [{"sleep": "5"}]}},
    "sleep as boolean": {"params": {"steps": [{"sleep": True}]}},
    "sleep too long": {"params": {"steps": [{"sleep": 10**6}]}},
    "tool without a name": {"params": {"steps": [{"tool": 7, "input": {}}]}},
    "usage not an object": {"params": {"steps": [{"usage": 100}]}},
    "usage of negative tokens": {"params": {"steps": [{"usage": {"input_tokens": -1}}]}},
    "usage tokens as text": {"params": {"steps": [{"usage": {"output_tokens": "abc"}}]}},
    "usage tokens as a boolean": {"params": {"steps": [{"usage": {"input_tokens": True}}]}},
    "usage cost as text": {"params": {"steps": [{"usage": {"cost_usd": "0.5"}}]}},
    "usage cost out of range": {"params": {"steps": [{"usage": {"cost_usd": 1e300}}]}},
    "usage model not text": {"params": {"steps": [{"usage": {"model": 3}}]}},
    "empty delegate": {"params": {"steps": [{"delegate": []}]}},
    "delegate not a list": {"params": {"steps": [{"delegate": {"agent_id": "x"}}]}},
    "delegate without agent_id": {"params": {"steps": [{"delegate": [{"input": "x"}]}]}},
}


@pytest.mark.parametrize("case", sorted(BAD_DEFINITIONS))
def test_registration_refuses_a_definition_that_cannot_run(admin_client, case):
    body = {"id": "bad-agent", "name": "Bad", "kind": "scripted", **BAD_DEFINITIONS[case]}
    response = admin_client.post("/api/agents", json=body)
    assert response.status_code == 422, response.get_json()
    assert response.get_json()["error"]["code"] == "validation_error"
    assert response.get_json()["error"]["message"]
    # nothing was registered
    assert admin_client.get("/api/agents/bad-agent").status_code == 404


def test_registration_accepts_every_step_and_put_validates_too(admin_client):
    good = {"id": "good-agent", "name": "Good", "kind": "scripted", "params": {"steps": [
        {"say": "hi {input}"}, {"sleep": 0.5}, {"sleep": 2},
        {"tool": "t", "input": {"a": 1}, "output": [1, 2]},
        {"usage": {"input_tokens": 1, "output_tokens": 2, "cost_usd": 0.1}},
        {"usage": {"input_tokens": 3, "model": "m"}}, {"usage": {"cost_usd": None}},
        {"delegate": [{"agent_id": "echo", "input": "x"}]}, {"fail": "no"},
    ]}}
    response = admin_client.post("/api/agents", json=good)
    assert response.status_code == 201, response.get_json()
    assert response.get_json()["version"] == 1
    assert admin_client.post("/api/agents", json={"id": "plain-echo", "name": "E",
                                                  "kind": "echo"}).status_code == 201

    bad = {**good, "params": {"steps": [{"sleep": -3}]}}
    response = admin_client.put("/api/agents/good-agent", json=bad)
    assert response.status_code == 422
    assert response.get_json()["error"]["code"] == "validation_error"
    detail = admin_client.get("/api/agents/good-agent").get_json()
    assert [v["version"] for v in detail["versions"]] == [1]  # no version was added

    response = admin_client.put("/api/agents/good-agent",
                                json={**good, "params": {"steps": [{"say": "v2"}]}})
    assert response.status_code == 200
    assert response.get_json()["version"] == 2


def test_registration_accepts_a_plugin_kind(admin_client, plugin):
    response = admin_client.post("/api/agents", json={"id": "loud", "name": "Loud",
                                                      "kind": "shout"})
    assert response.status_code == 201, response.get_json()
