"""Executor routes (CONTRACT §5): claim, heartbeat, events, children — and every refusal, each
of which must leave the ledger exactly as it was (row counts and the run's head)."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest
from support.api import (
    append,
    assert_error,
    assert_iso_utc,
    claim_run,
    ledger_state,
    open_session,
    post_message,
    unique,
)
from support.factories import make_agent


@pytest.fixture
def chat(api):
    return open_session(api, api.alice, title="exec")["id"]


@pytest.fixture
def running(api, chat):
    """A run claimed by ``instance``: (run_id, instance)."""
    run = post_message(api, api.alice, chat, "work")["run_id"]
    instance = unique("exec")
    claim_run(api, api.executor, run, instance)
    return run, instance


def _events(api, run):
    return api.get(f"/api/agent-runs/{run}/events", api.admin, query={"limit": 500}).json()["events"]


# ---- success paths -----------------------------------------------------------------------------


def test_claim_leases_queued_runs_with_their_snapshots(api, chat):
    posted = post_message(api, api.alice, chat, "the input")
    empty_first = api.post("/api/executor/claim", api.executor,
                           json={"executor_instance_id": "other", "max_runs": 1, "lease_seconds": 60})
    claimed = empty_first.json()["runs"]
    assert empty_first.status == 200 and len(claimed) == 1
    entry = claimed[0]
    assert {"run_id", "thread_id", "input", "agent_execution_snapshot", "context_pack_snapshot",
            "lease_expires_at"} <= set(entry)
    assert entry["run_id"] == posted["run_id"] and entry["input"] == "the input"
    assert entry["thread_id"].startswith("thr_")
    assert entry["agent_execution_snapshot"]["agent_id"] == "echo"
    assert_iso_utc(entry["lease_expires_at"])

    run = api.get(f"/api/agent-runs/{posted['run_id']}", api.alice).json()
    assert run["status"] == "running" and run["executor_instance_id"] == "other"
    assert run["lease_expires_at"] == entry["lease_expires_at"]
    lease = datetime.fromisoformat(run["lease_expires_at"]) - datetime.fromisoformat(run["started_at"])
    assert 59 <= lease.total_seconds() <= 61
    started = _events(api, posted["run_id"])[-1]
    assert started["type"] == "run.started" and started["data"]["executor_instance_id"] == "other"

    nothing = api.post("/api/executor/claim", api.executor, json={"executor_instance_id": "other"})
    assert nothing.status == 200 and nothing.json() == {"runs": []}


def test_claim_is_first_in_first_out_per_thread_and_honours_max_runs(api, chat):
    other_chat = open_session(api, api.alice)["id"]
    first = post_message(api, api.alice, chat, "1")["run_id"]
    second = post_message(api, api.alice, chat, "2")["run_id"]
    elsewhere = post_message(api, api.alice, other_chat, "3")["run_id"]
    one = api.post("/api/executor/claim", api.executor,
                   json={"executor_instance_id": "e1", "max_runs": 1}).json()["runs"]
    assert [r["run_id"] for r in one] == [first]
    rest = api.post("/api/executor/claim", api.executor,
                    json={"executor_instance_id": "e1", "max_runs": 10}).json()["runs"]
    assert [r["run_id"] for r in rest] == [elsewhere]  # `second` waits behind `first`
    assert append(api, api.executor, first, "e1", [("run.completed", {})]).status == 200
    after = api.post("/api/executor/claim", api.executor,
                     json={"executor_instance_id": "e1", "max_runs": 10}).json()["runs"]
    assert [r["run_id"] for r in after] == [second]


def _claim(api, instance: str, **body) -> tuple[list[dict], float]:
    started = time.monotonic()
    reply = api.post("/api/executor/claim", api.executor,
                     json={"executor_instance_id": instance, **body})
    assert reply.status == 200, reply
    return reply.json()["runs"], time.monotonic() - started


def test_an_empty_claim_waits_for_work_and_never_claims_after_waiting(api, chat):
    """``wait_seconds``: nothing claimable holds the answer until a run is queued (or the time
    passes); the answer is then empty, the run stays queued, and the next claim takes it. A
    server cannot tell that a waiting caller went away, so a claim after the wait could lease a
    run to nobody."""
    _claim(api, "warm-up", wait_seconds=0.3)  # the first wait may end as the watcher starts
    found, took = _claim(api, "idle", wait_seconds=0.6)
    assert found == [] and took >= 0.55

    posted = {}

    def post_later():
        time.sleep(0.4)
        posted.update(post_message(api, api.alice, chat, "wake up"))

    poster = threading.Thread(target=post_later)
    poster.start()
    found, took = _claim(api, "waiter", wait_seconds=5)
    poster.join()
    assert found == [] and 0.35 <= took < 4, took  # woken by the run, long before 5 s
    run = api.get(f"/api/agent-runs/{posted['run_id']}", api.alice).json()
    assert run["status"] == "queued"
    found, took = _claim(api, "waiter", wait_seconds=5)
    assert [r["run_id"] for r in found] == [posted["run_id"]] and took < 2  # no wait: claimed


def test_an_empty_claim_is_woken_when_a_threads_run_ends(api, chat, running):
    """The next run of a thread becomes claimable when the thread's running run ends: that
    ends a waiting claim too."""
    run, instance = running
    second = post_message(api, api.alice, chat, "after")["run_id"]
    _claim(api, "warm-up", wait_seconds=0.3)

    def end_later():
        time.sleep(0.4)
        assert append(api, api.executor, run, instance, [("run.completed", {})]).status == 200

    ender = threading.Thread(target=end_later)
    ender.start()
    found, took = _claim(api, "waiter", wait_seconds=5)
    ender.join()
    assert found == [] and 0.35 <= took < 4, took
    assert [r["run_id"] for r in _claim(api, "waiter")[0]] == [second]


def test_a_claim_under_the_name_of_recorded_runs_is_422_and_takes_nothing(api, chat):
    posted = post_message(api, api.alice, chat, "the input")
    reply = api.post("/api/executor/claim", api.executor,
                     json={"executor_instance_id": "otlp:checkout", "wait_seconds": 1})
    assert_error(reply, 422, "validation_error")
    assert "must not start with 'otlp:'" in reply.json()["error"]["message"]
    run = api.get(f"/api/agent-runs/{posted['run_id']}", api.alice).json()
    assert run["status"] == "queued" and run["executor_instance_id"] is None


@pytest.mark.parametrize("wait", [-1, 5.5, "soon", "1", False, None])
def test_a_claim_wait_outside_0_to_5_seconds_is_422(api, wait):
    reply = api.post("/api/executor/claim", api.executor,
                     json={"executor_instance_id": "x", "wait_seconds": wait})
    assert_error(reply, 422, "validation_error")


def test_heartbeat_extends_the_lease(api, running):
    run, instance = running
    before = api.get(f"/api/agent-runs/{run}", api.admin).json()["lease_expires_at"]
    time.sleep(0.01)
    reply = api.post(f"/api/executor/runs/{run}/heartbeat", api.executor,
                     json={"executor_instance_id": instance})
    assert reply.status == 200
    body = reply.json()
    assert set(body) == {"lease_expires_at", "cancel_requested"} and body["cancel_requested"] is False
    assert datetime.fromisoformat(body["lease_expires_at"]) > datetime.fromisoformat(before)
    assert api.get(f"/api/agent-runs/{run}", api.admin).json()["lease_expires_at"] == body["lease_expires_at"]
    assert len(_events(api, run)) == 2  # a heartbeat writes no event


@pytest.mark.parametrize("lease_seconds", [600, 5])
def test_a_heartbeat_renews_for_as_long_as_the_claim_leased(api, chat, lease_seconds):
    """A claim chose its lease: heartbeats renew it for that long, whatever the server's own
    lease setting, so a heartbeat never cuts a long lease short nor stretches a short one."""
    run = post_message(api, api.alice, chat, "long work")["run_id"]
    instance = unique("exec")
    claimed = claim_run(api, api.executor, run, instance, lease_seconds=lease_seconds)
    first = datetime.fromisoformat(claimed["lease_expires_at"])
    for _ in range(2):
        time.sleep(0.05)
        before = datetime.now(first.tzinfo)
        reply = api.post(f"/api/executor/runs/{run}/heartbeat", api.executor,
                         json={"executor_instance_id": instance})
        assert reply.status == 200, reply
        expires = datetime.fromisoformat(reply.json()["lease_expires_at"])
        assert expires > first
        left = (expires - before).total_seconds()
        assert lease_seconds - 1 < left < lease_seconds + 1, left
        first = expires


def test_events_append_in_order_and_complete_with_the_answer(api, running):
    run, instance = running
    reply = append(api, api.executor, run, instance, [
        ("message.delta", {"text": "Hel"}),
        ("tool.call", {"name": "search", "input": {"q": "x"}}),
        ("tool.result", {"name": "search", "output": {"hits": 2}}),
        ("usage", {"input_tokens": 10, "output_tokens": 4, "cost_usd": 0.0012}),
        ("message.delta", {"text": "lo"}),
    ])
    assert reply.status == 200 and reply.json() == {"seqs": [3, 4, 5, 6, 7], "cancel_requested": False}
    done = append(api, api.executor, run, instance, [("run.completed", {})])
    assert done.json()["seqs"] == [8]
    detail = api.get(f"/api/agent-runs/{run}", api.alice).json()
    assert detail["status"] == "succeeded" and detail["last_event_seq"] == 8
    completed = _events(api, run)[-1]
    assert completed["type"] == "run.completed"
    assert completed["data"]["final_message_id"] == detail["final_message_id"]
    prov = api.get(f"/api/messages/{detail['final_message_id']}/provenance", api.alice).json()
    assert prov["message"]["content"] == "Hello"
    assert [e["seq"] for e in _events(api, run)] == list(range(1, 9))


def test_completed_with_explicit_content_and_failed_and_interrupted(api, chat):
    runs = [post_message(api, api.alice, open_session(api, api.alice)["id"], f"m{i}")["run_id"]
            for i in range(3)]
    inst = unique("exec")
    claimed = api.post("/api/executor/claim", api.executor,
                       json={"executor_instance_id": inst, "max_runs": 3}).json()["runs"]
    assert [c["run_id"] for c in claimed] == runs
    assert append(api, api.executor, runs[0], inst,
                  [("message.delta", {"text": "draft"}), ("run.completed", {"content": "final"})]).status == 200
    final = api.get(f"/api/agent-runs/{runs[0]}", api.alice).json()["final_message_id"]
    assert api.get(f"/api/messages/{final}/provenance", api.alice).json()["message"]["content"] == "final"

    error = {"code": "agent_error", "message": "model unavailable"}
    assert append(api, api.executor, runs[1], inst, [("run.failed", {"error": error})]).status == 200
    failed = api.get(f"/api/agent-runs/{runs[1]}", api.alice).json()
    assert failed["status"] == "failed" and failed["error"] == error and failed["final_message_id"] is None

    assert append(api, api.executor, runs[2], inst,
                  [("run.interrupted", {"reason": "executor_shutdown"})]).status == 200
    assert api.get(f"/api/agent-runs/{runs[2]}", api.alice).json()["status"] == "interrupted"


def test_admins_may_use_the_executor_routes(api, chat):
    run = post_message(api, api.alice, chat)["run_id"]
    claim_run(api, api.admin, run, "admin-exec")
    assert append(api, api.admin, run, "admin-exec", [("run.completed", {"content": "ok"})]).status == 200


def test_children_are_created_for_the_lease_holder(api, running):
    run, instance = running
    reply = api.post(f"/api/executor/runs/{run}/children", api.executor,
                     json={"executor_instance_id": instance, "agent_id": "echo", "input": "sub"})
    assert reply.status == 201
    child = reply.json()["run_id"]
    detail = api.get(f"/api/agent-runs/{child}", api.alice).json()
    assert detail["parent_run_id"] == run and detail["root_run_id"] == run
    assert detail["session_id"] is None and detail["status"] == "queued"
    created = _events(api, run)[-1]
    assert created["type"] == "run.child_created"
    assert created["data"]["child_run_id"] == child and created["data"]["agent_id"] == "echo"


# ---- refusals: 409 and 422, each writing nothing -----------------------------------------------


def _refused(api, run, reply, status, codes):
    assert reply.status == status, reply
    code = assert_error(reply, status, reply.json()["error"]["code"])["code"]
    assert code in codes, reply
    return code


@pytest.mark.parametrize("case", [
    "events_by_another_instance", "heartbeat_by_another_instance", "children_by_another_instance",
    "events_on_a_queued_run", "heartbeat_on_a_queued_run",
])
def test_lease_lost(api, chat, running, case):
    run, instance = running
    queued = post_message(api, api.alice, open_session(api, api.alice)["id"])["run_id"]
    target = queued if "queued" in case else run
    before = ledger_state(api.db, target)
    if case.startswith("events"):
        reply = append(api, api.executor, target, "intruder", [("message.delta", {"text": "x"})])
    elif case.startswith("heartbeat"):
        reply = api.post(f"/api/executor/runs/{target}/heartbeat", api.executor,
                         json={"executor_instance_id": "intruder"})
    else:
        reply = api.post(f"/api/executor/runs/{target}/children", api.executor,
                         json={"executor_instance_id": "intruder", "agent_id": "echo", "input": "x"})
    assert_error(reply, 409, "lease_lost")
    assert ledger_state(api.db, target) == before


def test_lease_lost_after_the_run_ended(api, running):
    run, instance = running
    assert append(api, api.executor, run, instance, [("run.completed", {"content": "done"})]).status == 200
    before = ledger_state(api.db, run)
    assert_error(api.post(f"/api/executor/runs/{run}/heartbeat", api.executor,
                          json={"executor_instance_id": instance}), 409, "lease_lost")
    assert_error(append(api, api.executor, run, instance, [("message.delta", {"text": "late"})]),
                 409, "lease_lost")
    assert_error(append(api, api.executor, run, instance, [("run.failed", {"error": {
        "code": "x", "message": "y"}})]), 409, "lease_lost")
    assert_error(api.post(f"/api/executor/runs/{run}/children", api.executor,
                          json={"executor_instance_id": instance, "agent_id": "echo", "input": "x"}),
                 409, "lease_lost")
    assert ledger_state(api.db, run) == before


def test_lease_lost_after_the_lease_expired(api, chat):
    run = post_message(api, api.alice, chat)["run_id"]
    claim_run(api, api.executor, run, "slow", lease_seconds=1)
    time.sleep(1.1)
    before = ledger_state(api.db, run)
    assert_error(append(api, api.executor, run, "slow", [("message.delta", {"text": "x"})]),
                 409, "lease_lost")
    assert_error(api.post(f"/api/executor/runs/{run}/heartbeat", api.executor,
                          json={"executor_instance_id": "slow"}), 409, "lease_lost")
    assert ledger_state(api.db, run) == before


@pytest.mark.parametrize("batch", [
    [("run.started", {"executor_instance_id": "x"})],
    [("run.queued", {})],
    [("run.cancelling", {"requested_by": "x"})],
    [("run.child_created", {"child_run_id": "run_x", "agent_id": "echo"})],
    [("run.child_finished", {"child_run_id": "run_x", "status": "succeeded"})],
    [("run.cancelled", {"external_stop_confirmed": True})],  # only while cancelling
    [("message.delta", {"text": "ok"}), ("run.started", {"executor_instance_id": "x"})],
    [("message.delta", {"text": "ok"}), ("run.cancelled", {"external_stop_confirmed": True})],
], ids=lambda b: "+".join(t for t, _ in b))
def test_illegal_transitions_are_409_and_write_none_of_the_batch(api, running, batch):
    run, instance = running
    before = ledger_state(api.db, run)
    assert_error(append(api, api.executor, run, instance, batch), 409, "illegal_transition")
    assert ledger_state(api.db, run) == before
    assert api.get(f"/api/agent-runs/{run}", api.alice).json()["status"] == "running"


@pytest.mark.parametrize("batch", [
    [("run.completed", {}), ("message.delta", {"text": "after the end"})],
    [("run.completed", {}), ("run.failed", {"error": {"code": "x", "message": "y"}})],
    [("run.failed", {"error": {"code": "x", "message": "y"}}), ("run.completed", {})],
], ids=lambda b: "+".join(t for t, _ in b))
def test_nothing_may_follow_the_terminal_event_in_a_batch(api, running, batch):
    run, instance = running
    before = ledger_state(api.db, run)
    reply = append(api, api.executor, run, instance, batch)
    _refused(api, run, reply, 409, {"illegal_transition"})
    assert ledger_state(api.db, run) == before


@pytest.mark.parametrize("batch", [
    [("run.completed", {})],
    [("run.failed", {"error": {"code": "x", "message": "y"}})],
    [("message.delta", {"text": "last words"}), ("run.completed", {})],
    # The reconciler ends a cancelling run interrupted, never its executor (CONTRACT §2).
    [("run.interrupted", {"reason": "executor_shutdown"})],
], ids=lambda b: "+".join(t for t, _ in b))
def test_ending_a_cancelling_run_other_than_cancelled_is_409_cancel_requested(api, running, batch):
    run, instance = running
    assert api.post(f"/api/agent-runs/{run}/cancel", api.alice).json()["status"] == "cancelling"
    before = ledger_state(api.db, run)
    assert_error(append(api, api.executor, run, instance, batch), 409, "cancel_requested")
    assert ledger_state(api.db, run) == before
    # progress is still accepted while cancelling, and run.cancelled ends it exactly once
    progress = append(api, api.executor, run, instance, [("message.delta", {"text": "stopping"})])
    assert progress.status == 200 and progress.json()["cancel_requested"] is True
    assert append(api, api.executor, run, instance,
                  [("run.cancelled", {"external_stop_confirmed": True})]).status == 200
    types = [e["type"] for e in _events(api, run)]
    assert types.count("run.cancelled") == 1 and types[-1] == "run.cancelled"
    assert "run.completed" not in types and "run.failed" not in types


@pytest.mark.parametrize("body", [
    {"executor_instance_id": "E", "events": []},
    {"executor_instance_id": "E", "events": [{"type": "run.bogus", "data": {}}]},
    {"executor_instance_id": "E", "events": [{"type": "message.delta", "data": {}}]},
    {"executor_instance_id": "E", "events": [{"type": "message.delta", "data": {"text": 5}}]},
    {"executor_instance_id": "E", "events": [{"type": "message.delta", "data": "text"}]},
    {"executor_instance_id": "E", "events": [{"type": "usage", "data": {
        "input_tokens": -1, "output_tokens": 0, "cost_usd": 0}}]},
    {"executor_instance_id": "E", "events": [{"type": "tool.call", "data": {"input": {}}}]},
    {"executor_instance_id": "E", "events": [{"type": "run.failed", "data": {"error": "boom"}}]},
    {"executor_instance_id": "E", "events": [{"type": "run.interrupted", "data": {"reason": "bored"}}]},
    # What the ledger records when it saw a lease expire, a parent end or a process restart.
    {"executor_instance_id": "E", "events": [{"type": "run.interrupted", "data": {
        "reason": "lease_expired"}}]},
    {"executor_instance_id": "E", "events": [{"type": "run.interrupted", "data": {
        "reason": "parent_terminal"}}]},
    {"executor_instance_id": "E", "events": [{"type": "run.interrupted", "data": {
        "reason": "service_restart"}}]},
    {"executor_instance_id": "E", "events": [{"type": "message.delta", "data": {"text": "ok"}},
                                             {"type": "message.delta", "data": {"text": "a\x00b"}}]},
    {"executor_instance_id": "E", "events": [{"type": "message.delta", "data": {"text": "x"},
                                              "seq": 99}]},
    {"executor_instance_id": "E", "status": "succeeded",
     "events": [{"type": "message.delta", "data": {"text": "x"}}]},
    {"events": [{"type": "message.delta", "data": {"text": "x"}}]},
    # Usage data is stored as sent: a count or a cost that is not a JSON number is refused.
    {"executor_instance_id": "E", "events": [{"type": "usage", "data": {
        "input_tokens": "5", "output_tokens": 0, "cost_usd": None}}]},
    {"executor_instance_id": "E", "events": [{"type": "usage", "data": {
        "input_tokens": 5, "output_tokens": True, "cost_usd": None}}]},
    {"executor_instance_id": "E", "events": [{"type": "usage", "data": {
        "input_tokens": 5, "output_tokens": 1.0, "cost_usd": None}}]},
    {"executor_instance_id": "E", "events": [{"type": "usage", "data": {
        "input_tokens": 5, "output_tokens": 1, "cost_usd": "0.5"}}]},
    {"executor_instance_id": "E", "events": [{"type": "usage", "data": {
        "input_tokens": 5, "output_tokens": 1, "cost_usd": False}}]},
], ids=range(21))
def test_invalid_event_batches_are_422_and_write_nothing(api, running, body):
    run, instance = running
    body = {**body, **({"executor_instance_id": instance} if "executor_instance_id" in body else {})}
    before = ledger_state(api.db, run)
    reply = api.post(f"/api/executor/runs/{run}/events", api.executor, json=body)
    assert_error(reply, 422, "validation_error")
    assert ledger_state(api.db, run) == before


def test_children_refusals(api, chat, running):
    run, instance = running
    make_agent(api.db, "traced", kind="external")  # runs elsewhere: recorded from its traces
    before = ledger_state(api.db, run)
    assert_error(api.post(f"/api/executor/runs/{run}/children", api.executor,
                          json={"executor_instance_id": instance, "agent_id": "ghost", "input": "x"}),
                 422, "unknown_agent")
    assert_error(api.post(f"/api/executor/runs/{run}/children", api.executor,
                          json={"executor_instance_id": instance, "agent_id": "echo", "input": ""}),
                 422, "validation_error")
    assert_error(api.post(f"/api/executor/runs/{run}/children", api.executor,
                          json={"executor_instance_id": instance, "agent_id": "traced",
                                "input": "x"}), 422, "validation_error")
    assert ledger_state(api.db, run) == before
    assert api.post(f"/api/agent-runs/{run}/cancel", api.alice).status == 202
    before = ledger_state(api.db, run)
    reply = api.post(f"/api/executor/runs/{run}/children", api.executor,
                     json={"executor_instance_id": instance, "agent_id": "echo", "input": "x"})
    assert_error(reply, 409, "cancel_requested")  # a cancelling run may not delegate
    assert ledger_state(api.db, run) == before
