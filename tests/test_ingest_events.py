"""Appending events: gapless seqs, hash chain, all-or-nothing batches, leases, terminal events."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from support.expiry import expire_lease
from support.factories import claim, make_agent, make_session, post
from support.ledger import (
    assert_chains_ok,
    assert_run_invariants,
    event_types,
    events,
    message_row,
    run_row,
    snapshot_state,
)

from agentledger.core.errors import (
    CancelRequested,
    IllegalTransition,
    LeaseLost,
    RunTerminal,
    ValidationFailed,
)
from agentledger.core.hashing import sha256_hex, snapshot_sha256
from agentledger.core.outcome_sums import RUN_TOKENS_MAX
from agentledger.core.schema import RunEvent
from ingest.cancel import request_cancel
from ingest.event_types import MAX_COST_USD_PER_CALL, MAX_TOKENS_PER_CALL
from ingest.events import append_events
from ingest.runs import create_child_run

W = "worker-1"


@pytest.fixture
def running(db):
    """A claimed (running) run leased to ``worker-1``."""
    make_agent(db, "echo")
    posted = post(db, make_session(db), "question")
    [claimed] = claim(db, W)
    assert claimed.run_id == posted.run_id
    return posted.run_id


def append(db, run_id, batch, *, executor=W, **kw):
    with db.write() as s:
        return append_events(s, run_id, batch, executor_instance_id=executor, **kw)


def delta(text):
    return ("message.delta", {"text": text})


def test_seqs_are_gapless_and_last_event_seq_is_the_max(db, running):
    r1 = append(db, running, [delta("a"), delta("b")])
    r2 = append(db, running, [("tool.call", {"name": "search", "input": {"q": "x"}}),
                              ("tool.result", {"name": "search", "output": [1, 2]})])
    r3 = append(db, running, [("usage", {"input_tokens": 3, "output_tokens": 4,
                                         "cost_usd": 0.01})])
    assert (r1.seqs, r2.seqs, r3.seqs) == ([3, 4], [5, 6], [7])
    assert r3.status == "running" and r3.cancel_requested is False
    evs = events(db, running)
    assert [e.seq for e in evs] == list(range(1, 8))
    assert [e.type for e in evs] == ["run.queued", "run.started", "message.delta",
                                     "message.delta", "tool.call", "tool.result", "usage"]
    assert run_row(db, running).last_event_seq == 7
    assert evs[4].data == {"name": "search", "input": {"q": "x"}}
    assert_chains_ok(db)


# On PostgreSQL a batch of up to 32 events goes in with the head advance, a longer one with COPY.
@pytest.mark.parametrize("size", [2, 32, 33, 100])
def test_a_batch_of_any_size_stores_what_was_given_and_chains(db, running, size):
    given = [("message.delta", {"text": f"line {i}\n\t\"quoted\" \\ ünïcødé 🚀", "n": i})
             for i in range(size - 1)]
    given.append(("tool.call", {"name": "search", "input": {"q": None, "x": [1.5, True, {}]}}))
    for start in (3, size + 3):  # the second batch goes in on a connection that did one before
        reply = append(db, running, given)
        assert reply.seqs == list(range(start, start + size))
    evs = events(db, running)
    assert [e.seq for e in evs] == list(range(1, 2 * size + 3))
    assert [(e.type, e.data) for e in evs[2:]] == given * 2
    with db.read() as s:
        stamps = s.scalars(select(RunEvent.created_at).where(RunEvent.run_id == running)
                           .order_by(RunEvent.seq)).all()
    assert len(set(stamps[2:size + 2])) == 1 and stamps[size + 2] >= stamps[2]  # the db's clock
    assert run_row(db, running).last_event_seq == 2 * size + 2
    assert_chains_ok(db)


@pytest.mark.parametrize(
    "batch, error",
    [
        ([delta("ok"), delta("ok"), ("run.started", {"executor_instance_id": W})],
         IllegalTransition),
        ([delta("ok"), ("run.completed", {}), delta("after the end")], IllegalTransition),
        ([("run.completed", {}), ("run.failed", {"error": {"code": "x", "message": "y"}})],
         IllegalTransition),
        ([delta("ok"), ("run.cancelled", {"external_stop_confirmed": True})], IllegalTransition),
        ([delta("ok"), ("usage", {"input_tokens": -1, "output_tokens": 0, "cost_usd": 0})],
         ValidationFailed),
        ([delta("ok"), ("usage", {"input_tokens": MAX_TOKENS_PER_CALL + 1, "output_tokens": 0,
                                  "cost_usd": 0})], ValidationFailed),
        ([delta("ok"), ("usage", {"input_tokens": 1, "output_tokens": 10**20, "cost_usd": 0})],
         ValidationFailed),
        ([delta("ok"), ("usage", {"input_tokens": 1, "output_tokens": 1, "cost_usd": 1e308})],
         ValidationFailed),
        ([delta("ok"), ("run.queued", {})], IllegalTransition),
        ([delta("ok"), ("no.such.type", {})], ValidationFailed),
        ([delta("ok"), ("run.interrupted", {"reason": "bored"})], ValidationFailed),
        ([delta("ok"), ("run.cancelled", {"external_stop_confirmed": False})], ValidationFailed),
    ],
)
def test_a_batch_with_one_refused_event_writes_nothing(db, running, batch, error):
    append(db, running, [delta("before")])
    before = snapshot_state(db)
    with pytest.raises(error):
        append(db, running, batch)
    assert snapshot_state(db) == before
    assert run_row(db, running).status == "running"
    assert_chains_ok(db)


def test_a_run_of_the_largest_usage_ends_with_its_token_sums_saturated(db, running):
    """However many of the largest usage events a run holds, its ending stores its totals
    (saturated) and the run ends: absurd counts never leave it unable to end."""
    largest = ("usage", {"input_tokens": MAX_TOKENS_PER_CALL, "output_tokens": 7,
                         "cost_usd": MAX_COST_USD_PER_CALL})
    append(db, running, [largest] * 1_001)
    result = append(db, running, [("run.failed", {"error": {"code": "x", "message": "y"}})])
    assert result.status == "failed"
    run = run_row(db, running)
    assert run.usage_input_tokens == RUN_TOKENS_MAX and run.usage_output_tokens == 7_007
    assert run.usage_cost_usd == pytest.approx(1_001 * MAX_COST_USD_PER_CALL)
    assert_run_invariants(db, running)


def test_lease_is_checked_wrong_executor(db, running):
    before = snapshot_state(db)
    with pytest.raises(LeaseLost):
        append(db, running, [delta("x")], executor="worker-2")
    with pytest.raises(LeaseLost):
        append(db, running, [("run.completed", {})], executor="worker-2")
    assert snapshot_state(db) == before


def test_lease_is_checked_queued_run(db):
    make_agent(db, "echo")
    posted = post(db, make_session(db))
    before = snapshot_state(db)
    with pytest.raises(LeaseLost):
        append(db, posted.run_id, [delta("x")])
    assert snapshot_state(db) == before


def test_expired_lease_is_lost(db):
    make_agent(db, "echo")
    posted = post(db, make_session(db))
    claim(db, W, lease_seconds=600)  # "in time" cannot be late, however busy the machine
    append(db, posted.run_id, [delta("in time")])
    expire_lease(db, posted.run_id)
    before = snapshot_state(db)
    with pytest.raises(LeaseLost):
        append(db, posted.run_id, [delta("too late")])
    with pytest.raises(LeaseLost):
        append(db, posted.run_id, [("run.completed", {})])
    assert snapshot_state(db) == before


def test_completed_creates_the_answer_from_the_deltas(db, running):
    append(db, running, [delta("Hello"), delta(", ")])
    result = append(db, running, [delta("world"), delta("!"), ("run.completed", {})])
    assert result.status == "succeeded" and result.final_message_id
    run = run_row(db, running)
    assert run.status == "succeeded" and run.final_message_id == result.final_message_id
    assert run.finished_at is not None and run.error is None
    message = message_row(db, run.final_message_id)
    assert message.role == "assistant" and message.content == "Hello, world!"
    assert message.run_id == running and message.session_id == run.session_id
    assert message.thread_id == run.thread_id and message.owner_id == run.owner_id
    last = events(db, running)[-1]
    assert last.type == "run.completed"
    assert last.data == {"final_message_id": result.final_message_id,
                         "content_sha256": hashlib.sha256(b"Hello, world!").hexdigest()}
    assert_run_invariants(db, running)
    assert_chains_ok(db)


def test_completed_with_given_content(db, running):
    append(db, running, [delta("draft")])
    result = append(db, running, [("run.completed", {"content": "the final answer"})])
    assert message_row(db, result.final_message_id).content == "the final answer"


def test_the_answers_digest_is_the_ledgers_not_the_executors(db, running):
    """The executor cannot bind another text to the answer: the ledger computes the digest of
    the text it stores, over whatever the executor sent."""
    result = append(db, running, [("run.completed", {"content": "the answer",
                                                     "content_sha256": "0" * 64})])
    last = events(db, running)[-1]
    assert last.data["content_sha256"] == hashlib.sha256(b"the answer").hexdigest()
    assert message_row(db, result.final_message_id).content == "the answer"


def test_completed_without_deltas_is_an_empty_answer(db, running):
    result = append(db, running, [("run.completed", {})])
    assert message_row(db, result.final_message_id).content == ""


def test_failed_records_the_error(db, running):
    error = {"code": "agent_error", "message": "the tool crashed"}
    result = append(db, running, [delta("partial"), ("run.failed", {"error": error})])
    assert result.status == "failed" and result.final_message_id is None
    run = run_row(db, running)
    assert run.status == "failed" and run.error == error and run.final_message_id is None
    assert run.finished_at is not None
    assert events(db, running)[-1].data == {"error": error}
    assert_run_invariants(db, running)


@pytest.mark.parametrize("ending", [
    ("run.completed", {}),
    ("run.failed", {"error": {"code": "e", "message": "m"}}),
    ("run.interrupted", {"reason": "executor_shutdown"}),
])
def test_exactly_one_terminal_event_and_it_is_last(db, running, ending):
    append(db, running, [delta("x"), ending])
    before = snapshot_state(db)
    for batch in ([delta("late")], [("run.completed", {})], [ending],
                  [("run.interrupted", {"reason": "lease_expired"})]):
        with pytest.raises(RunTerminal):
            append(db, running, batch, executor=None)
        with pytest.raises(LeaseLost):
            append(db, running, batch)
    assert snapshot_state(db) == before
    types = event_types(db, running)
    assert types[-1] == ending[0]
    assert sum(t in ("run.completed", "run.failed", "run.cancelled", "run.interrupted")
               for t in types) == 1
    assert_run_invariants(db, running)


def test_cancelling_run_refuses_completion(db, running):
    with db.write() as s:
        assert request_cancel(s, running, requested_by="alice") == "cancelling"
    before = snapshot_state(db)
    for ending in (("run.completed", {}), ("run.failed", {"error": {"code": "e", "message": "m"}})):
        with pytest.raises(CancelRequested):
            append(db, running, [delta("still going"), ending])
    assert snapshot_state(db) == before
    # Progress may still be reported while the executor stops, then it confirms.
    r = append(db, running, [delta("stopping")])
    assert r.cancel_requested is True and r.status == "cancelling"
    r = append(db, running, [("run.cancelled", {"external_stop_confirmed": True})])
    assert r.status == "cancelled"
    assert_run_invariants(db, running)


def test_child_finishing_tells_its_running_parent(db, running):
    make_agent(db, "helper")
    with db.write() as s:
        child = create_child_run(s, running, agent_id="helper", input="sub task",
                                 executor_instance_id=W)
    parent_events = events(db, running)
    assert parent_events[-1].type == "run.child_created"
    assert parent_events[-1].data == {"child_run_id": child, "agent_id": "helper"}
    child_row = run_row(db, child)
    parent_row = run_row(db, running)
    assert child_row.session_id is None and child_row.parent_run_id == running
    assert child_row.root_run_id == running and child_row.thread_id != parent_row.thread_id
    assert child_row.context_pack_snapshot == parent_row.context_pack_snapshot
    assert child_row.agent_execution_snapshot["agent_id"] == "helper"
    assert events(db, child)[0].data == {
        "agent_id": "helper", "session_id": None, "parent_run_id": running,
        "input_sha256": sha256_hex(child_row.input),
        "agent_snapshot_sha256": snapshot_sha256(child_row.agent_execution_snapshot),
        "context_pack_sha256": snapshot_sha256(child_row.context_pack_snapshot)}

    [claimed] = claim(db, "worker-2")
    assert claimed.run_id == child and claimed.parent_run_id == running
    result = append(db, child, [delta("sub answer"), ("run.completed", {})], executor="worker-2")
    answer = message_row(db, result.final_message_id)
    assert answer.session_id is None and answer.thread_id == child_row.thread_id

    last = events(db, running)[-1]
    assert last.type == "run.child_finished"
    assert last.data == {"child_run_id": child, "status": "succeeded"}
    assert run_row(db, running).status == "running"
    append(db, running, [("run.completed", {})])
    for rid in (running, child):
        assert_run_invariants(db, rid)
    assert_chains_ok(db)


def test_child_finishing_after_its_parent_adds_nothing_to_the_parent(db, running):
    make_agent(db, "helper")
    with db.write() as s:
        child = create_child_run(s, running, agent_id="helper", input="x", executor_instance_id=W)
    claim(db, "worker-2")
    append(db, running, [("run.completed", {})])
    parent_before = event_types(db, running)
    append(db, child, [("run.failed", {"error": {"code": "e", "message": "m"}})],
           executor="worker-2")
    assert event_types(db, running) == parent_before


def test_delegation_needs_a_running_leased_parent(db, running):
    make_agent(db, "helper")
    before = snapshot_state(db)
    with pytest.raises(LeaseLost), db.write() as s:
        create_child_run(s, running, agent_id="helper", input="x", executor_instance_id="other")
    with db.write() as s:
        request_cancel(s, running, requested_by="alice")
    before = snapshot_state(db)
    with pytest.raises(CancelRequested), db.write() as s:  # it is to stop, not to delegate
        create_child_run(s, running, agent_id="helper", input="x", executor_instance_id=W)
    assert snapshot_state(db) == before


# Values whose JSON text a database may rewrite (PostgreSQL's jsonb stores numbers as numeric):
# the chain must still verify after they come back from the database.
TRICKY_VALUES = [
    -0.0, 0.0, 1.0, 0.1, 1e16, 1e300, 1.7976931348623157e308, 5e-324, 1.5e-10,
    12345678901234567890.5, 2**70, -(2**63), "é\u2028\u2029 ✓ 😀", "", [], {},
    {"b": 1, "a": [1.0, {"c": None}], "": True},
]


@pytest.mark.parametrize("value", TRICKY_VALUES, ids=repr)
def test_event_data_round_trips_through_the_hash_chain(db, running, value):
    append(db, running, [("tool.call", {"name": "t", "input": value})])
    assert_chains_ok(db, running)


@pytest.mark.parametrize("bad", ["nul \x00 byte", "lone \ud800 surrogate", float("nan"),
                                 float("inf"), {"k": [float("-inf")]}])
def test_event_data_that_is_not_storable_json_is_refused(db, running, bad):
    before = snapshot_state(db)
    with pytest.raises(ValidationFailed):
        append(db, running, [("tool.call", {"name": "t", "input": bad})])
    with pytest.raises(ValidationFailed):
        append(db, running, [("tool.result", {"name": "t", "output": {"nested": [bad]}})])
    assert snapshot_state(db) == before


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
                              max_size=8), inner, max_size=4),
    max_leaves=12,
)


def test_any_json_event_data_verifies(db, running):
    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(value=json_values)
    def check(value):
        append(db, running, [("tool.result", {"name": "t", "output": value})])
        assert_chains_ok(db, running)

    check()
