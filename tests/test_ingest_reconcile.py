"""Reconciliation: expired leases, orphaned queued children, executor restarts."""

from __future__ import annotations

import threading

import pytest
from support.expiry import expire_lease
from support.factories import claim, make_agent, make_session, post
from support.ledger import assert_chains_ok, assert_run_invariants, events, run_row, snapshot_state

from agentledger.core.errors import IllegalTransition, LeaseLost
from ingest.cancel import request_cancel
from ingest.events import append_events
from ingest.leases import claim_run, heartbeat
from ingest.reconcile import (
    expired_lease_run_ids,
    interrupt_executor_runs,
    interrupt_if_lease_expired,
    interrupt_if_orphaned,
    orphaned_child_run_ids,
)
from ingest.runs import create_child_run

W = "worker-1"


@pytest.fixture
def agent(db):
    make_agent(db, "echo")
    make_agent(db, "helper")


def reconcile_once(db) -> tuple[list[str], list[str]]:
    """One reconciler pass, as the loop does it: each run in its own short transaction."""
    with db.read() as s:
        expired = expired_lease_run_ids(s)
    ended = []
    for run_id in expired:
        with db.write() as s:
            if interrupt_if_lease_expired(s, run_id):
                ended.append(run_id)
    with db.read() as s:
        orphans = orphaned_child_run_ids(s)
    dropped = []
    for run_id in orphans:
        with db.write() as s:
            if interrupt_if_orphaned(s, run_id):
                dropped.append(run_id)
    return ended, dropped


def test_expired_lease_is_interrupted_not_rerun(db, agent):
    # long leases, run out below by moving their deadlines: the first pass, while they hold,
    # cannot come too late on a busy machine
    expiring = post(db, make_session(db), "slow").run_id
    claim(db, W, lease_seconds=600)
    cancelling = post(db, make_session(db), "also slow").run_id
    claim(db, "worker-2", lease_seconds=600)
    with db.write() as s:
        request_cancel(s, cancelling, requested_by="alice")
    healthy = post(db, make_session(db), "fine").run_id
    claim(db, "worker-3", lease_seconds=600)
    queued = post(db, make_session(db), "waiting").run_id

    assert reconcile_once(db) == ([], [])
    expire_lease(db, expiring)
    expire_lease(db, cancelling)
    with db.read() as s:
        assert set(expired_lease_run_ids(s)) == {expiring, cancelling}
    ended, dropped = reconcile_once(db)
    assert set(ended) == {expiring, cancelling} and dropped == []

    for run_id, executor in ((expiring, W), (cancelling, "worker-2")):
        run = run_row(db, run_id)
        assert run.status == "interrupted" and run.finished_at is not None
        last = events(db, run_id)[-1]
        assert last.type == "run.interrupted"
        assert last.data["reason"] == "lease_expired"
        assert last.data["executor_instance_id"] == executor
        assert_run_invariants(db, run_id)
    assert run_row(db, healthy).status == "running"
    assert run_row(db, queued).status == "queued"
    # Never re-run: the interrupted run is not claimable again, and its executor lost the lease.
    assert [c.run_id for c in claim(db, "worker-9", max_runs=10)] == [queued]
    with pytest.raises(LeaseLost), db.write() as s:
        append_events(s, expiring, [("run.completed", {})], executor_instance_id=W)

    before = snapshot_state(db)
    assert reconcile_once(db) == ([], [])  # a second pass finds nothing left to do
    assert snapshot_state(db) == before
    assert_chains_ok(db)


def test_interrupt_rechecks_under_the_lock(db, agent):
    """A run whose lease was renewed after the scan is left alone."""
    run_id = post(db, make_session(db)).run_id
    claim(db, W, lease_seconds=600)
    expire_lease(db, run_id)
    with db.read() as s:
        assert expired_lease_run_ids(s) == [run_id]
    with db.write() as s:  # a late heartbeat does not revive it (the lease is gone) ...
        with pytest.raises(LeaseLost):
            heartbeat(s, run_id, W)
    with db.write() as s:
        assert interrupt_if_lease_expired(s, run_id) is True
    with db.write() as s:
        assert interrupt_if_lease_expired(s, run_id) is False
    live = post(db, make_session(db)).run_id
    claim(db, W, lease_seconds=600)
    before = snapshot_state(db)
    with db.write() as s:
        assert interrupt_if_lease_expired(s, live) is False
    assert snapshot_state(db) == before


def test_queued_child_of_a_terminal_parent_is_interrupted(db, agent):
    parent = post(db, make_session(db)).run_id
    claim(db, W)
    with db.write() as s:
        orphan = create_child_run(s, parent, agent_id="helper", input="x",
                                  executor_instance_id=W)
        sibling = create_child_run(s, parent, agent_id="helper", input="y",
                                   executor_instance_id=W)
    [c] = claim(db, "worker-2", max_runs=1)
    assert c.run_id == orphan
    assert reconcile_once(db) == ([], [])
    with db.write() as s:
        append_events(s, parent, [("run.failed", {"error": {"code": "e", "message": "m"}})],
                      executor_instance_id=W)
    parent_events = events(db, parent)

    # Before the reconciler's pass, no claim starts the ended parent's queued child: a worker
    # started again at once (its parents ended executor_shutdown) must not run it.
    assert claim(db, "worker-3", max_runs=5) == []
    with db.write() as s:
        with pytest.raises(IllegalTransition):
            claim_run(s, sibling, "worker-3")

    ended, dropped = reconcile_once(db)
    assert ended == [] and dropped == [sibling]
    assert "run.started" not in [e.type for e in events(db, sibling)]
    last = events(db, sibling)[-1]
    assert last.type == "run.interrupted"
    assert last.data == {"reason": "parent_terminal", "parent_run_id": parent,
                         "parent_status": "failed"}
    assert run_row(db, sibling).status == "interrupted"
    # The running child is not an orphan: it finishes on its own; the ended parent hears nothing.
    assert run_row(db, orphan).status == "running"
    assert events(db, parent) == parent_events
    with db.write() as s:
        assert interrupt_if_orphaned(s, orphan) is False
        assert interrupt_if_orphaned(s, parent) is False
    for r in (parent, orphan, sibling):
        assert_run_invariants(db, r)


def test_executor_restart_interrupts_its_unfinished_runs(db, agent):
    mine = [post(db, make_session(db), f"m{i}").run_id for i in range(3)]
    claim(db, W, max_runs=3)
    with db.write() as s:
        request_cancel(s, mine[1], requested_by="alice")
    with db.write() as s:
        append_events(s, mine[2], [("run.completed", {})], executor_instance_id=W)
    theirs = post(db, make_session(db)).run_id
    claim(db, "worker-2")
    queued = post(db, make_session(db)).run_id
    finished_events = events(db, mine[2])

    with db.write() as s:
        ended = interrupt_executor_runs(s, W, reason="service_restart")
    assert set(ended) == {mine[0], mine[1]}
    for run_id in ended:
        last = events(db, run_id)[-1]
        assert (last.type, last.data) == (
            "run.interrupted", {"reason": "service_restart", "executor_instance_id": W})
        assert run_row(db, run_id).status == "interrupted"
        assert_run_invariants(db, run_id)
    assert events(db, mine[2]) == finished_events
    assert run_row(db, theirs).status == "running"
    assert run_row(db, queued).status == "queued"

    before = snapshot_state(db)
    with db.write() as s:
        assert interrupt_executor_runs(s, W, reason="service_restart") == []
    assert snapshot_state(db) == before
    assert_chains_ok(db)


def test_two_executors_ending_their_runs_at_once_never_deadlock(pg_db):
    """Two instances stopping (or starting again) at the same moment, whose trees cross: a
    parent held by one, its child by the other. Ending each instance's runs in one transaction
    deadlocked here (each held rows the other's next run needed, the interruption count's
    among them); one transaction per run never waits for a row while holding another run's."""
    from agentledger.worker.backends import DatabaseBackend

    db = pg_db
    make_agent(db, "echo")
    make_agent(db, "helper")
    for round_ in range(4):
        a, b = f"stop-a-{round_}", f"stop-b-{round_}"
        roots = [post(db, make_session(db), f"root {n}").run_id for n in range(16)]
        held = {a: claim(db, a, max_runs=8), b: claim(db, b, max_runs=8)}
        by_instance = {i: [c.run_id for c in runs] for i, runs in held.items()}
        assert sorted(by_instance[a] + by_instance[b]) == sorted(roots)
        # The children of b's roots first, so that a (claiming first) takes them: every tree
        # crosses the two instances.
        with db.write() as s:
            for instance in (b, a):
                for parent in by_instance[instance]:
                    create_child_run(s, parent, agent_id="helper", input="sub",
                                     executor_instance_id=instance)
        assert len(claim(db, a, max_runs=8)) == 8 and len(claim(db, b, max_runs=8)) == 8

        start, errors, ended = threading.Barrier(2), [], {}

        def stop(instance: str, start=start, ended=ended, errors=errors) -> None:
            start.wait()
            try:
                ended[instance] = DatabaseBackend(db, instance).interrupt_held(
                    "executor_shutdown", [])
            except Exception as exc:  # noqa: BLE001 - the assertion below names it
                errors.append(exc)

        threads = [threading.Thread(target=stop, args=(i,)) for i in (a, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        assert len(ended[a]) == len(ended[b]) == 16
        for run_id in ended[a] + ended[b]:
            assert_run_invariants(db, run_id)
            assert run_row(db, run_id).status == "interrupted"
    assert_chains_ok(db)


def test_a_server_started_with_fewer_workers_ends_the_runs_of_the_slots_it_no_longer_runs(db, agent):
    """``serve --workers 3`` killed, then started with ``--workers 1``: slot 0's executor ends
    its own leftovers when it starts, and the master ends those of slots 1 and 2 (no executor
    will ever run as them again), ``service_restart`` rather than ``lease_expired`` later."""
    from agentledger.core.config import Settings
    from agentledger.server import end_runs_of_retired_slots, executor_instance_id

    held = {}
    for slot in range(3):
        held[slot] = post(db, make_session(db), f"slot {slot}").run_id
        claim(db, executor_instance_id(8050, slot))
    other_port = post(db, make_session(db), "another server").run_id
    claim(db, executor_instance_id(80, 1))  # serve-<host>-80-1: not a slot of port 8050

    ended = end_runs_of_retired_slots(Settings(database_url=db.url), 8050, workers=1)
    assert ended == 2
    for slot in (1, 2):
        last = events(db, held[slot])[-1]
        assert (last.type, last.data) == ("run.interrupted", {
            "reason": "service_restart", "executor_instance_id": executor_instance_id(8050, slot)})
        assert_run_invariants(db, held[slot])
    assert run_row(db, held[0]).status == "running"  # its own executor's to end
    assert run_row(db, other_port).status == "running"
    assert end_runs_of_retired_slots(Settings(database_url=db.url), 8050, workers=1) == 0
    assert_chains_ok(db)
