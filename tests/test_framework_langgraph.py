"""Kind ``langgraph`` (CONTRACT §7): real LangGraph graphs with a fake chat model, run by the
real executor on SQLite and PostgreSQL, checkpoints in the ledger's own database."""

from __future__ import annotations

import json
import signal
import threading

import pytest
from framework_agents import lg_graphs
from support.factories import make_agent, make_session, post
from support.frameworks import WORKER_PYTHONPATH, answer_of, answered, ask, two_turns_in_a_worker
from support.processes import (
    assert_one_terminal_event,
    events,
    run,
    runs,
    status,
    types,
    wait_for_status,
    wait_terminal,
    wait_until,
)

from agentledger.agent_kinds import validate_definition
from agentledger.agent_kinds.storage import langgraph_checkpointer
from agentledger.core.json_limits import MAX_ERROR_MESSAGE
from ingest.cancel import request_cancel

GRAPH = "framework_agents.lg_graphs:graph"
# Short leases so that a killed worker's run is given up quickly (deadlines stay generous).
LEASE, HEARTBEAT, RECONCILE = 3, 1, 1
FAST = {"AGENTLEDGER_LEASE_SECONDS": str(LEASE), "AGENTLEDGER_HEARTBEAT_SECONDS": str(HEARTBEAT),
        "AGENTLEDGER_RECONCILE_SECONDS": str(RECONCILE)}
# A worker whose runs must end as they would (not lease_expired) heartbeats every second against
# a lease that outlasts a stall of a busy machine; a worker killed on purpose keeps a short one.
SAFE = {**FAST, "AGENTLEDGER_LEASE_SECONDS": "15"}
KILLED_LEASE = 6
PRICING = {"fake-model": {"input_per_million": 2.0, "output_per_million": 8.0}}


@pytest.fixture
def lg_db(fw_db):
    return fw_db


@pytest.fixture
def executors(fw_executors):
    return fw_executors


def graph_agent(db, agent_id="weather", graph=GRAPH, **params) -> str:
    return make_agent(db, agent_id, kind="langgraph", params={"graph": graph, **params})



def test_memory_across_runs_and_a_fresh_executor(lg_db, executors):
    graph_agent(lg_db)
    session = make_session(lg_db, agent_id="weather")
    executors.start("exec-1")
    first, end = ask(lg_db, session, "my name is Ada")
    assert end.type == "run.completed"
    assert answer_of(lg_db, first) == "Hello, you said: my name is Ada."
    executors.close()  # the checkpoints outlive the executor that wrote them
    executors.start("exec-2")
    second = answered(lg_db, session, "what is my name?")
    assert answer_of(lg_db, second) == "You first said: my name is Ada. Now: what is my name?."
    assert run(lg_db, second).thread_id == run(lg_db, first).thread_id
    # The second run started from the checkpoint the first one left.
    resolved = [e for e in events(lg_db, second) if e.type == "agent.resolved"][0]
    assert resolved.data["checkpoint_id"]
    first_resolved = [e for e in events(lg_db, first) if e.type == "agent.resolved"][0]
    assert first_resolved.data["checkpoint_id"] is None


def test_streaming_order_tools_usage_and_resolved(lg_db, executors):
    graph_agent(lg_db, pricing=PRICING)
    session = make_session(lg_db, agent_id="weather")
    executors.start()
    run_id = answered(lg_db, session, "weather in Paris")
    evs = events(lg_db, run_id)
    kinds = [e.type for e in evs]
    assert kinds[:3] == ["run.queued", "run.started", "agent.resolved"], kinds
    assert kinds.index("tool.call") < kinds.index("tool.result") < kinds.index("message.delta")
    call = next(e.data for e in evs if e.type == "tool.call")
    result = next(e.data for e in evs if e.type == "tool.result")
    assert call == {"name": "get_weather", "input": {"city": "Paris"}, "call_id": call["call_id"]}
    assert call["call_id"] and result["call_id"] == call["call_id"]
    assert result["name"] == "get_weather" and result["output"] == "sunny in Paris"
    deltas = [e.data["text"] for e in evs if e.type == "message.delta"]
    assert len(deltas) > 1  # streamed in chunks, not one message
    assert "".join(deltas) == answer_of(lg_db, run_id) == "The weather: sunny in Paris."
    usages = [e.data for e in evs if e.type == "usage"]
    assert len(usages) == 2  # one per model response: the tool call, then the answer
    for usage in usages:
        assert usage["model"] == "fake-model"
        expected = (usage["input_tokens"] * 2.0 + usage["output_tokens"] * 8.0) / 1e6
        assert usage["cost_usd"] == pytest.approx(expected)
    resolved = evs[2].data
    assert resolved["source"] == GRAPH and resolved["tools"] == ["get_weather"]
    assert resolved["name"] == "graph" and resolved["package"] == "framework_agents"
    assert len(resolved["content_hash"]) == 64
    assert set(resolved) >= {"model", "instructions_sha256", "package_version", "checkpoint_id"}


def progress(evs) -> list[tuple[str, str]]:
    """The run's output events as comparable values (type, data)."""
    return [(e.type, json.dumps(e.data, sort_keys=True)) for e in evs
            if e.type in {"message.delta", "tool.call", "tool.result", "usage"}]


@pytest.mark.parametrize("graph", ["with_subgraph", "with_nested_subgraph"])
def test_a_subgraph_streams_as_it_runs_each_event_once(lg_db, executors, graph):
    graph_agent(lg_db, graph=f"framework_agents.lg_graphs:{graph}", pricing=PRICING)
    session = make_session(lg_db, agent_id="weather")
    executors.start()
    # The second turn too: the parent's update then carries the first turn's messages again.
    for city in ("Paris", "Rome"):
        run_id = answered(lg_db, session, f"weather in {city}")
        evs = events(lg_db, run_id)
        kinds = [e.type for e in evs]
        assert kinds.count("tool.call") == 1 and kinds.count("tool.result") == 1, kinds
        assert kinds.count("usage") == 2, kinds  # the tool call's response, then the answer's
        # Streamed from inside the subgraph as it ran: the tool first, then the answer in chunks.
        assert kinds.index("tool.call") < kinds.index("tool.result") < kinds.index("message.delta")
        deltas = [e.data["text"] for e in evs if e.type == "message.delta"]
        assert len(deltas) > 1, deltas
        assert "".join(deltas) == answer_of(lg_db, run_id) == f"The weather: sunny in {city}."
        call = next(e.data for e in evs if e.type == "tool.call")
        result = next(e.data for e in evs if e.type == "tool.result")
        assert call["input"] == {"city": city} and result["output"] == f"sunny in {city}"
        assert call["call_id"] and result["call_id"] == call["call_id"]
        assert all(u.data["model"] == "fake-model" for u in evs if u.type == "usage")
        outputs = progress(evs)
        assert len(set(outputs)) == len(outputs), outputs  # nothing reported twice
        resolved = next(e.data for e in evs if e.type == "agent.resolved")
        assert resolved["tools"] == ["get_weather"]


def test_unknown_price_is_null_and_factory_graph(lg_db, executors):
    graph_agent(lg_db, graph="framework_agents.lg_graphs:build",
                pricing={"another-model": {"input_per_million": 1, "output_per_million": 1}})
    session = make_session(lg_db, agent_id="weather")
    executors.start()
    run_id, end = ask(lg_db, session, "hi")
    assert end.type == "run.completed"
    usage = next(e.data for e in events(lg_db, run_id) if e.type == "usage")
    assert usage["cost_usd"] is None and usage["model"] == "fake-model"
    resolved = next(e.data for e in events(lg_db, run_id) if e.type == "agent.resolved")
    assert resolved["name"] == "weather-graph" and resolved["source"].endswith(":build")


def test_interrupt_then_resume_on_the_same_thread(lg_db, executors):
    graph_agent(lg_db, "planner", graph="framework_agents.lg_graphs:asking")
    session = make_session(lg_db, agent_id="planner")
    executors.start()
    first, end = ask(lg_db, session, "plan a trip")
    assert end.type == "run.completed"
    assert end.data["awaiting_input"] is True
    assert end.data["interrupt"] == "Which city, for 'plan a trip'?"
    assert answer_of(lg_db, first) == "Which city, for 'plan a trip'?"
    second, end = ask(lg_db, session, "Lisbon")
    assert end.type == "run.completed" and "awaiting_input" not in end.data
    assert answer_of(lg_db, second) == "Booked a trip to Lisbon."


def test_cancel_stops_the_graph_and_nothing_follows(lg_db, executors):
    graph_agent(lg_db)
    session = make_session(lg_db, agent_id="weather")
    executors.start()
    lg_graphs.SLOW_CHUNKS["count"] = 0
    posted = post(lg_db, session, "slow please")
    wait_until(lambda: any(e.type == "message.delta" for e in events(lg_db, posted.run_id)),
               timeout=30)
    with lg_db.write() as s:
        request_cancel(s, posted.run_id, requested_by="alice")
    wait_for_status(lg_db, posted.run_id, "cancelled", timeout=30)
    end = assert_one_terminal_event(lg_db, posted.run_id)
    assert end.data == {"external_stop_confirmed": True}
    produced = lg_graphs.SLOW_CHUNKS["count"]
    assert produced < 200  # the model stopped instead of generating its whole answer
    evs = events(lg_db, posted.run_id)
    kinds = [e.type for e in evs]
    cancelling = kinds.index("run.cancelling")
    # Only chunks already under way when the cancel was written, then the one confirmation.
    assert set(kinds[cancelling + 1:-1]) <= {"message.delta"}, kinds
    assert kinds[-1] == "run.cancelled" and kinds.count("run.cancelled") == 1
    # Nothing ran on after the cancel: the model produces no more chunks.
    wait_until(lambda: True, timeout=1.0)
    assert lg_graphs.SLOW_CHUNKS["count"] == produced
    assert [e.type for e in events(lg_db, posted.run_id)] == kinds


def saved_anywhere(db_url: str, thread_id: str, text: str) -> bool:
    """Whether ``text`` is in any checkpoint of the thread, or in a write pending on one."""
    with langgraph_checkpointer(db_url) as saver:
        return any(text in repr(saved.checkpoint) or text in repr(saved.pending_writes)
                   for saved in saver.list({"configurable": {"thread_id": thread_id}}))


@pytest.mark.slow  # waits for the abandoned node's 5 s to check it wrote nothing
def test_cancel_while_a_node_runs_plain_code_ends_within_a_second(lg_db, db_url, executors):
    graph_agent(lg_db, "plodder", graph="framework_agents.lg_graphs:plodding")
    session = make_session(lg_db, agent_id="plodder")
    executors.start()
    lg_graphs.PLOD.update(steps=0, finished=False, answered=[])
    first = answered(lg_db, session, "my name is Ada")
    assert answer_of(lg_db, first) == "Earlier: nothing (0 answered). Now: my name is Ada."

    posted = post(lg_db, session, "plod along")
    wait_until(lambda: lg_graphs.PLOD["steps"] > 0, timeout=30)
    with lg_db.write() as s:
        request_cancel(s, posted.run_id, requested_by="alice")
    wait_for_status(lg_db, posted.run_id, "cancelled", timeout=30)
    assert not lg_graphs.PLOD["finished"]  # the run ended without waiting for the busy node
    end = assert_one_terminal_event(lg_db, posted.run_id)
    assert end.data == {"external_stop_confirmed": True}
    evs = events(lg_db, posted.run_id)
    kinds = [e.type for e in evs]
    assert kinds[kinds.index("run.cancelling") + 1:] == ["run.cancelled"], kinds
    cancelling = next(e for e in evs if e.type == "run.cancelling")
    # Within half of what the node had left to run (5 s in all): it did not wait for the node.
    # The contract's "within 1 s" is a latency (0.05-0.15 s measured on a busy 2-core machine),
    # which a test on a starved machine cannot hold to; the bound here cannot be met by waiting.
    assert (end.created_at - cancelling.created_at).total_seconds() < 2.5, (cancelling, end)

    # The next run of the thread need not wait for the abandoned node: it finds the memory the
    # cancelled run left (its question, no answer).
    second = answered(lg_db, session, "what now?")
    assert answer_of(lg_db, second) == ("Earlier: my name is Ada | plod along (1 answered). "
                                        "Now: what now?.")
    # The node finishes in the background; its graph runs no further node and writes nothing,
    # neither events nor checkpoints, and its thread ends.
    wait_until(lambda: lg_graphs.PLOD["finished"], timeout=30)
    wait_until(lambda: not [t for t in threading.enumerate() if posted.run_id in t.name],
               timeout=30, message="the abandoned graph's thread to end")
    assert "plod along" not in lg_graphs.PLOD["answered"]
    assert [e.type for e in events(lg_db, posted.run_id)] == kinds
    assert not saved_anywhere(db_url, run(lg_db, posted.run_id).thread_id, "plodded all the way")
    third = answered(lg_db, session, "and now?")
    assert answer_of(lg_db, third) == ("Earlier: my name is Ada | plod along | what now? "
                                       "(2 answered). Now: and now?.")


def test_exception_in_the_graph_fails_the_run(lg_db, executors):
    graph_agent(lg_db)
    session = make_session(lg_db, agent_id="weather")
    executors.start()
    run_id, end = ask(lg_db, session, "boom now")
    assert end.type == "run.failed"
    assert end.data["error"] == {"code": "agent_error", "message": "ValueError: the model broke"}


def test_an_exception_longer_than_an_error_holds_still_fails_the_run(lg_db, executors):
    """Its message was refused (over 10,000 characters, or with a NUL), with agent.resolved in
    the same batch: the run stayed running until its lease expired and ended interrupted, the
    agent's error lost. It is cut to what the error holds, and said so."""
    graph_agent(lg_db)
    session = make_session(lg_db, agent_id="weather")
    executors.start()
    run_id, end = ask(lg_db, session, "rant on")
    assert end.type == "run.failed"
    message = end.data["error"]["message"]
    assert len(message) == MAX_ERROR_MESSAGE and end.data["error"]["code"] == "agent_error"
    assert message.startswith("ValueError: why\ufffd!!!")
    assert message.endswith(" … (cut: 100,016 characters in all)")
    assert [e.type for e in events(lg_db, run_id)][-2:] == ["agent.resolved", "run.failed"]


def test_a_worker_that_cannot_load_the_graph_fails_the_run(lg_db, executors):
    make_agent(lg_db, "missing", kind="langgraph", params={"graph": "no_such_module_x:graph"})
    session = make_session(lg_db, agent_id="missing")
    executors.start()
    run_id, end = ask(lg_db, session, "hi")
    assert end.type == "run.failed"
    assert end.data["error"]["code"] == "agent_unavailable"
    assert "no_such_module_x" in end.data["error"]["message"]
    assert "agent.resolved" not in [e.type for e in events(lg_db, run_id)]


def test_a_node_delegates_to_child_runs(lg_db, executors):
    make_agent(lg_db, "helper", kind="echo")
    graph_agent(lg_db, "boss", graph="framework_agents.lg_graphs:delegating")
    session = make_session(lg_db, agent_id="boss")
    executors.start(concurrency=1)
    run_id = answered(lg_db, session, "the job")
    assert answer_of(lg_db, run_id) == "children: succeeded, succeeded"
    tree = runs(lg_db, root_run_id=run_id)
    children = [r for r in tree if r.parent_run_id == run_id]
    assert len(children) == 2 and {r.status for r in children} == {"succeeded"}
    assert all(r.session_id is None and r.thread_id != run(lg_db, run_id).thread_id for r in children)
    kinds = [e.type for e in events(lg_db, run_id)]
    assert kinds.count("run.child_created") == 2 and kinds.count("run.child_finished") == 2


@pytest.mark.parametrize(("graph", "fragment"), [
    ("not a reference", "package.module:attr"),
    ("no_such_module_x:graph", "cannot import module 'no_such_module_x'"),
    ("framework_agents.lg_graphs:nope", "has no attribute 'nope'"),
    ("framework_agents.lg_graphs:compiled", "compiled graph"),
    ("framework_agents.lg_graphs:not_a_graph", "not a LangGraph StateGraph"),
])
def test_registration_refuses_what_cannot_run(graph, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        validate_definition("langgraph", {"graph": graph})
    validate_definition("langgraph", {"graph": GRAPH})
    validate_definition("langgraph", {"graph": "framework_agents.lg_graphs:build"})


def test_registration_through_the_api_is_422_and_writes_nothing(api):
    before = api.get("/api/agents", token=api.admin).json()
    reply = api.post("/api/agents", token=api.admin, json={
        "id": "bad-graph", "name": "Bad", "kind": "langgraph",
        "params": {"graph": "framework_agents.lg_graphs:compiled"}})
    assert reply.status == 422, reply
    assert reply.json()["error"]["code"] == "validation_error"
    assert "compiled graph" in reply.json()["error"]["message"]
    assert api.get("/api/agents", token=api.admin).json() == before
    reply = api.post("/api/agents", token=api.admin, json={
        "id": "good-graph", "name": "Good", "kind": "langgraph", "params": {"graph": GRAPH}})
    assert reply.status == 201, reply


# ---- async parts: the kind drives graphs with the sync ``graph.stream`` ------------------

ASYNC = "support.async_graphs"
SYNC_ONLY = "nodes must be synchronous functions (def, not async def) for the langgraph kind"


@pytest.mark.parametrize(("graph", "named"), [
    ("with_async_node", 'params.graph: node "b" is an async function'),
    ("with_async_edge", 'conditional edge "route" from node "a" is an async function'),
    ("with_async_tool", 'tool "lookup" of node "tools" is an async function'),
    ("with_async_subgraph", 'node "team" > node "b" is an async function'),
])
def test_registration_refuses_a_graph_with_async_parts(graph, named):
    with pytest.raises(ValueError) as refused:
        validate_definition("langgraph", {"graph": f"{ASYNC}:{graph}"})
    assert named in str(refused.value) and SYNC_ONLY in str(refused.value)
    assert "No synchronous function" not in str(refused.value)
    validate_definition("langgraph", {"graph": f"{ASYNC}:plain"})  # its sync twin
    validate_definition("langgraph", {"graph": f"{ASYNC}:build_async"})  # the run will tell


def test_registering_an_async_node_graph_through_the_api_is_422_and_writes_nothing(api):
    before = api.get("/api/agents", token=api.admin).json()
    body = {"id": "async-graph", "name": "Async", "kind": "langgraph",
            "params": {"graph": f"{ASYNC}:with_async_node"}}
    reply = api.post("/api/agents", token=api.admin, json=body)
    assert reply.status == 422, reply
    error = reply.json()["error"]
    assert error["code"] == "validation_error"
    assert 'node "b"' in error["message"] and SYNC_ONLY in error["message"]
    assert api.get("/api/agents", token=api.admin).json() == before

    good = {**body, "params": {"graph": f"{ASYNC}:plain"}}
    assert api.post("/api/agents", token=api.admin, json=good).status == 201
    registered = api.get("/api/agents/async-graph", token=api.admin).json()
    reply = api.request("PUT", "/api/agents/async-graph", token=api.admin, json=body)
    assert reply.status == 422, reply
    assert 'node "b"' in reply.json()["error"]["message"]
    assert api.get("/api/agents/async-graph", token=api.admin).json() == registered


@pytest.mark.parametrize("graph", [
    "with_async_node",  # registered as it was before its module changed (no check now)
    "build_async",  # a factory's graph: only the run sees it
])
def test_a_graph_found_async_at_run_time_fails_the_run_saying_why(lg_db, executors, graph):
    graph_agent(lg_db, "later-async", graph=f"{ASYNC}:{graph}")
    session = make_session(lg_db, agent_id="later-async")
    executors.start()
    run_id, end = ask(lg_db, session, "hi")
    assert end.type == "run.failed"
    error = end.data["error"]
    assert error["code"] == "agent_unavailable", error
    assert 'node "b" is an async function' in error["message"] and SYNC_ONLY in error["message"]
    assert "agent.resolved" not in [e.type for e in events(lg_db, run_id)]


def test_a_plain_sync_graph_registers_and_runs(lg_db, executors):
    validate_definition("langgraph", {"graph": f"{ASYNC}:plain"})
    graph_agent(lg_db, "plain", graph=f"{ASYNC}:plain")
    session = make_session(lg_db, agent_id="plain")
    executors.start()
    run_id = answered(lg_db, session, "hi")
    assert answer_of(lg_db, run_id) == "b saw: a saw: hi"


@pytest.mark.slow  # starts a worker process (inside the helper)
def test_a_separate_worker_process_runs_the_graph(lg_db, db_url, tmp_path):
    graph_agent(lg_db)
    session = make_session(lg_db, agent_id="weather")
    first, second = two_turns_in_a_worker(lg_db, db_url, tmp_path, session, "lg-worker",
                                          ("my name is Ada", "and again"))
    assert run(lg_db, second).executor_instance_id == "lg-worker"
    assert answer_of(lg_db, second) == "You first said: my name is Ada. Now: and again."


def test_a_worker_killed_mid_graph_is_interrupted_and_the_thread_goes_on(lg_db, db_url, procs):
    graph_agent(lg_db, "staller", graph="framework_agents.lg_graphs:stalling")
    session = make_session(lg_db, agent_id="staller")
    reconciler = procs.start("reconcile", ["reconcile"], procs.environment(db_url, **FAST))
    reconciler.wait_for_log(r"reconciling every 1s")
    # Its first run must succeed, and its lease expire soon after it is killed.
    worker = procs.worker(db_url, "lg-worker-1", PYTHONPATH=WORKER_PYTHONPATH,
                          **{**FAST, "AGENTLEDGER_LEASE_SECONDS": str(KILLED_LEASE)})
    first, end = ask(lg_db, session, "my name is Ada", timeout=60)
    assert end.type == "run.completed", (end, procs.logs())
    assert answer_of(lg_db, first) == "Hello, you said: my name is Ada."

    # The model streams one chunk of its answer and then hangs: the graph is mid-flight.
    stalled = post(lg_db, session, "stall for a while").run_id
    wait_until(lambda: status(lg_db, stalled) == "running"
               and "message.delta" in types(lg_db, stalled), timeout=60,
               message=lambda: f"the graph to be mid-flight: {types(lg_db, stalled)}\n"
                               f"{procs.logs()}")
    worker.kill_group(signal.SIGKILL)
    assert worker.wait(10) == -signal.SIGKILL
    wait_terminal(lg_db, stalled, timeout=KILLED_LEASE + 60)
    end = assert_one_terminal_event(lg_db, stalled)
    assert end.type == "run.interrupted", end
    assert end.data["reason"] == "lease_expired"
    assert end.data["executor_instance_id"] == "lg-worker-1"
    interrupted = types(lg_db, stalled)

    procs.worker(db_url, "lg-worker-2", PYTHONPATH=WORKER_PYTHONPATH, **SAFE)
    third, end = ask(lg_db, session, "what is my name?", timeout=60)
    assert end.type == "run.completed", (end, procs.logs())
    assert run(lg_db, third).executor_instance_id == "lg-worker-2"
    assert run(lg_db, third).thread_id == run(lg_db, stalled).thread_id == run(lg_db, first).thread_id
    # The graph sees only its checkpoints, not the ledger's history, and they hold what the
    # ledger's history holds: every earlier question, an answer only for the run that succeeded.
    assert answer_of(lg_db, third) == ("Earlier: my name is Ada | stall for a while "
                                       "(1 answered). Now: what is my name?.")
    # It started from the checkpoint the killed run left mid-flight, not from an older one.
    starts = [next(e.data["checkpoint_id"] for e in events(lg_db, r) if e.type == "agent.resolved")
              for r in (first, stalled, third)]
    assert starts[0] is None and starts[1] and starts[2] and starts[2] != starts[1]
    # The killed run was given up, never run again: nothing was added to it.
    assert types(lg_db, stalled) == interrupted
    assert interrupted.count("run.started") == 1 and "run.completed" not in interrupted
