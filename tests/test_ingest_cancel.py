"""Cancel requests: queued ends at once, running goes through cancelling, the subtree follows."""

from __future__ import annotations

import pytest
from support.factories import claim, make_agent, make_session, post
from support.ledger import assert_chains_ok, assert_run_invariants, events, run_row, snapshot_state

from agentledger.core.errors import NotFound, RunTerminal
from ingest.cancel import request_cancel
from ingest.events import append_events
from ingest.runs import create_child_run

W = "worker-1"


@pytest.fixture
def agent(db):
    make_agent(db, "echo")
    make_agent(db, "helper")
    return "echo"


def cancel(db, run_id, *, by="alice", visible_to=None):
    with db.write() as s:
        return request_cancel(s, run_id, requested_by=by, visible_to=visible_to)


def append(db, run_id, batch, executor=W):
    with db.write() as s:
        return append_events(s, run_id, batch, executor_instance_id=executor)


def child_of(db, parent, executor=W, agent="helper"):
    with db.write() as s:
        return create_child_run(s, parent, agent_id=agent, input="sub",
                                executor_instance_id=executor)


def test_queued_run_is_cancelled_immediately(db, agent):
    run_id = post(db, make_session(db)).run_id
    assert cancel(db, run_id) == "cancelled"
    evs = events(db, run_id)
    assert [e.type for e in evs] == ["run.queued", "run.cancelled"]
    assert evs[-1].data["external_stop_confirmed"] is True
    run = run_row(db, run_id)
    assert run.status == "cancelled" and run.finished_at is not None
    assert claim(db, W) == []
    assert_run_invariants(db, run_id)


def test_running_run_goes_through_cancelling(db, agent):
    run_id = post(db, make_session(db)).run_id
    claim(db, W)
    assert cancel(db, run_id, by="alice") == "cancelling"
    last = events(db, run_id)[-1]
    assert (last.type, last.data) == ("run.cancelling", {"requested_by": "alice"})
    assert run_row(db, run_id).status == "cancelling"

    before = snapshot_state(db)
    assert cancel(db, run_id) == "cancelling"  # repeating is harmless: nothing new is written
    assert cancel(db, run_id, by="admin") == "cancelling"
    assert snapshot_state(db) == before

    result = append(db, run_id, [("run.cancelled", {"external_stop_confirmed": True})])
    assert result.status == "cancelled"
    types = [e.type for e in events(db, run_id)]
    assert types == ["run.queued", "run.started", "run.cancelling", "run.cancelled"]
    assert_run_invariants(db, run_id)


@pytest.mark.parametrize("ending", [
    ("run.completed", {}),
    ("run.failed", {"error": {"code": "e", "message": "m"}}),
    ("run.interrupted", {"reason": "executor_shutdown"}),
])
def test_terminal_run_is_run_terminal(db, agent, ending):
    run_id = post(db, make_session(db)).run_id
    claim(db, W)
    append(db, run_id, [ending])
    before = snapshot_state(db)
    with pytest.raises(RunTerminal):
        cancel(db, run_id)
    assert snapshot_state(db) == before


def test_cancelled_run_cannot_be_cancelled_into_anything_else(db, agent):
    run_id = post(db, make_session(db)).run_id
    cancel(db, run_id)
    before = snapshot_state(db)
    with pytest.raises(RunTerminal):
        cancel(db, run_id)
    assert snapshot_state(db) == before


def test_unknown_or_foreign_run_is_not_found(db, agent):
    run_id = post(db, make_session(db, owner="alice"), owner="alice").run_id
    before = snapshot_state(db)
    with pytest.raises(NotFound):
        cancel(db, "run_nope")
    with pytest.raises(NotFound):
        cancel(db, run_id, by="bob", visible_to="bob")
    assert snapshot_state(db) == before
    assert cancel(db, run_id, visible_to="alice") == "cancelled"


def test_cancel_cascades_to_every_non_terminal_descendant(db, agent):
    root = post(db, make_session(db)).run_id
    claim(db, W)
    busy_child = child_of(db, root)      # will run and delegate further
    plain_child = child_of(db, root)     # will run
    done_child = child_of(db, root)      # will have finished
    claimed = {c.run_id for c in claim(db, "worker-2", max_runs=10)}
    assert claimed == {busy_child, plain_child, done_child}
    append(db, done_child, [("run.completed", {})], executor="worker-2")
    grand_running = child_of(db, busy_child, executor="worker-2")
    grand_queued = child_of(db, busy_child, executor="worker-2")
    [c] = claim(db, "worker-3", max_runs=1)
    assert c.run_id == grand_running
    queued_child = child_of(db, root)    # never claimed
    done_events = events(db, done_child)

    assert cancel(db, root) == "cancelling"
    tree = (root, busy_child, plain_child, done_child, queued_child, grand_running, grand_queued)
    status = {r: run_row(db, r).status for r in tree}
    assert status == {
        root: "cancelling", busy_child: "cancelling", plain_child: "cancelling",
        done_child: "succeeded", queued_child: "cancelled",
        grand_running: "cancelling", grand_queued: "cancelled",
    }
    assert events(db, done_child) == done_events
    # Queued descendants were cancelled at once; their (cancelling) parents heard about it.
    told = [e.data for e in events(db, busy_child) if e.type == "run.child_finished"]
    assert told == [{"child_run_id": grand_queued, "status": "cancelled"}]
    told = [e.data for e in events(db, root) if e.type == "run.child_finished"]
    assert told == [{"child_run_id": done_child, "status": "succeeded"},
                    {"child_run_id": queued_child, "status": "cancelled"}]
    for r in (busy_child, plain_child, grand_running):
        stops = [e.data for e in events(db, r) if e.type == "run.cancelling"]
        assert stops == [{"requested_by": "alice"}]

    # Each executor confirms; the tree ends with every run in exactly one terminal state.
    append(db, grand_running, [("run.cancelled", {"external_stop_confirmed": True})],
           executor="worker-3")
    for r in (busy_child, plain_child):
        append(db, r, [("run.cancelled", {"external_stop_confirmed": True})], executor="worker-2")
    append(db, root, [("run.cancelled", {"external_stop_confirmed": True})])
    for r in tree:
        assert run_row(db, r).status == ("succeeded" if r == done_child else "cancelled")
        assert_run_invariants(db, r)
    assert_chains_ok(db)


def test_cancelling_a_child_leaves_its_parent_alone(db, agent):
    root = post(db, make_session(db)).run_id
    claim(db, W)
    child = child_of(db, root)
    assert cancel(db, child) == "cancelled"
    assert run_row(db, root).status == "running"
    assert events(db, root)[-1].data == {"child_run_id": child, "status": "cancelled"}


def test_a_cancelling_run_is_ended_by_its_executor_confirming_or_by_the_ledger(db, agent):
    """CONTRACT §2: while cancelling, only run.cancelled (the executor) or run.interrupted (the
    reconciler) ends the run. An executor's own run.interrupted is refused; a stopping executor
    leaves the run to the reconciler; a process starting again ends its leftovers, these too."""
    from agentledger.core.errors import CancelRequested
    from ingest.reconcile import interrupt_executor_runs

    run_id = post(db, make_session(db)).run_id
    claim(db, W)
    assert cancel(db, run_id) == "cancelling"
    before = snapshot_state(db)
    with pytest.raises(CancelRequested):
        append(db, run_id, [("run.interrupted", {"reason": "executor_shutdown"})])
    with db.write() as s:
        assert interrupt_executor_runs(s, W, reason="executor_shutdown") == []
    assert snapshot_state(db) == before
    with db.write() as s:
        assert interrupt_executor_runs(s, W, reason="service_restart") == [run_id]
    assert run_row(db, run_id).status == "interrupted"
    assert_run_invariants(db, run_id)
