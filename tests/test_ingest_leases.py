"""Claims (per-thread FIFO) and heartbeats."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from support.expiry import expire_lease
from support.factories import claim, make_agent, make_session, post
from support.ledger import assert_run_invariants, events, run_row, snapshot_state
from support.statements import statements_sent

from agentledger.core import dialect
from agentledger.core.errors import LeaseLost, ValidationFailed
from ingest.cancel import request_cancel
from ingest.events import append_events
from ingest.leases import claim_runs, heartbeat
from ingest.runs import ContextItem
from queries.chain_verification import verify_chains

W = "worker-1"


@pytest.fixture
def agent(db):
    return make_agent(db, "echo", name="Echo")


def beat(db, run_id, executor=W, lease_seconds=30):
    with db.write() as s:
        return heartbeat(s, run_id, executor, lease_seconds=lease_seconds)


def finish(db, run_id, executor=W):
    with db.write() as s:
        append_events(s, run_id, [("run.completed", {})], executor_instance_id=executor)


def test_claim_starts_the_run_with_a_lease(db, agent):
    chat = make_session(db)
    posted = post(db, chat, "the input", context=[ContextItem(id="d1", title="Doc",
                                                                 content="doc body", version=2)])
    t0 = datetime.now(UTC)
    [c] = claim(db, W, lease_seconds=30)
    assert c.run_id == posted.run_id and c.input == "the input"
    assert c.parent_run_id is None and c.root_run_id == posted.run_id
    assert c.agent_execution_snapshot["name"] == "Echo"
    assert c.context == [{**c.context_pack_snapshot["items"][0], "content": "doc body"}]
    run = run_row(db, posted.run_id)
    assert c.thread_id == run.thread_id
    assert run.status == "running" and run.executor_instance_id == W
    assert run.lease_expires_at == c.lease_expires_at
    assert 20 < (run.lease_expires_at - t0).total_seconds() < 40
    assert run.started_at is not None
    started = events(db, posted.run_id)[-1]
    assert (started.seq, started.type) == (2, "run.started")
    assert started.data["executor_instance_id"] == W
    assert datetime.fromisoformat(started.data["lease_expires_at"]) == c.lease_expires_at
    assert claim(db, "worker-2") == []


def test_claim_takes_oldest_first_up_to_max_runs(db, agent):
    runs = [post(db, make_session(db), f"m{i}").run_id for i in range(5)]
    first = claim(db, W, max_runs=2)
    assert [c.run_id for c in first] == runs[:2]
    rest = claim(db, "worker-2", max_runs=10)
    assert [c.run_id for c in rest] == runs[2:]
    assert {run_row(db, r).executor_instance_id for r in runs[2:]} == {"worker-2"}


def test_a_claim_of_several_runs_starts_each_and_writes_the_starts_together(db, agent):
    """Each run of a claim gets its own ``run.started`` (next seq, chained hash, the lease) and
    its stream's notification; on PostgreSQL the starts of the whole claim are one statement."""
    runs = [post(db, make_session(db), f"m{i}").run_id for i in range(4)]
    heard: list[tuple[str, str]] = []
    db.add_notification_listener(lambda channel, payload: heard.append((channel, payload)))
    with statements_sent(db) as sent:
        claimed = claim(db, W, max_runs=10, lease_seconds=30)
    assert [c.run_id for c in claimed] == runs
    inserts = [s for s in sent if "INSERT INTO run_event" in s]
    assert len(inserts) == (1 if db.is_postgres else len(runs))
    assert sorted(p for c, p in heard if c == dialect.EVENTS_CHANNEL) == sorted(runs)
    for c in claimed:
        evs = assert_run_invariants(db, c.run_id)
        assert [e.type for e in evs] == ["run.queued", "run.started"]
        assert evs[1].data == {"executor_instance_id": W,
                               "lease_expires_at": c.lease_expires_at.isoformat()}
        run = run_row(db, c.run_id)
        assert (run.status, run.executor_instance_id) == ("running", W)
        assert run.lease_expires_at == c.lease_expires_at
        assert run.started_at == run.last_heartbeat_at
        with db.read() as s:
            report = verify_chains(s, run_id=c.run_id)
        assert report.ok, report.problems
    assert len({run_row(db, r).started_at for r in runs}) == 1  # one claim, one clock reading
    for c in claimed:  # the lease works: the runs go on and end
        finish(db, c.run_id)
        assert run_row(db, c.run_id).status == "succeeded"


def test_per_thread_fifo(db, agent):
    chat = make_session(db)
    first = post(db, chat, "first").run_id
    second = post(db, chat, "second").run_id
    third = post(db, chat, "third").run_id
    other = post(db, make_session(db), "elsewhere").run_id

    assert [c.run_id for c in claim(db, W, max_runs=10)] == [first, other]
    assert claim(db, W, max_runs=10) == []          # second waits while first is running
    with db.write() as s:
        request_cancel(s, first, requested_by="alice")
    assert claim(db, W, max_runs=10) == []          # ... and while it is cancelling
    with db.write() as s:
        append_events(s, first, [("run.cancelled", {"external_stop_confirmed": True})],
                      executor_instance_id=W)
    assert [c.run_id for c in claim(db, W, max_runs=10)] == [second]
    assert run_row(db, third).status == "queued"
    finish(db, second)
    assert [c.run_id for c in claim(db, W, max_runs=10)] == [third]
    for rid in (first, second, third, other):
        assert_run_invariants(db, rid)


def test_a_queued_run_cancelled_before_start_lets_the_next_one_go(db, agent):
    chat = make_session(db)
    first = post(db, chat, "first").run_id
    second = post(db, chat, "second").run_id
    with db.write() as s:
        assert request_cancel(s, first, requested_by="alice") == "cancelled"
    assert [c.run_id for c in claim(db, W)] == [second]


def test_a_run_ending_with_a_queued_run_behind_it_tells_the_claim_loops(db, agent):
    """The end of a thread's running run makes the next one claimable: the queue's
    notification goes out with that commit (to this process's claim loops from the commit,
    to other processes through NOTIFY); an end with nothing queued behind it sends none."""
    heard: list[tuple[str, str]] = []
    db.add_notification_listener(lambda channel, payload: heard.append((channel, payload)))
    listener = None
    if db.is_postgres:
        import psycopg

        listener = psycopg.connect(db.url.replace("postgresql+psycopg", "postgresql"),
                                   autocommit=True)
        listener.execute(f"LISTEN {dialect.QUEUE_CHANNEL}")
    try:
        chat = make_session(db)
        first = post(db, chat, "first").run_id
        second = post(db, chat, "second").run_id
        alone = post(db, make_session(db), "alone").run_id
        assert [c.run_id for c in claim(db, W)] == [first, alone]

        def queue_notices():
            return [payload for channel, payload in heard if channel == dialect.QUEUE_CHANNEL]

        heard.clear()
        finish(db, alone)
        assert queue_notices() == []
        finish(db, first)
        thread = run_row(db, first).thread_id
        assert queue_notices() == [thread]
        if listener is not None:
            received = [n.payload for n in listener.notifies(timeout=5, stop_after=4)]
            # the three posts', then the ending's (alone's end sent none)
            assert received == [first, second, alone, thread]
        heard.clear()
        assert [c.run_id for c in claim(db, W)] == [second]
        finish(db, second)
        assert queue_notices() == []
    finally:
        if listener is not None:
            listener.close()


def test_claim_arguments_are_checked(db, agent):
    post(db, make_session(db))
    before = snapshot_state(db)
    for kwargs in ({"lease_seconds": 0}, {"lease_seconds": 3601}, {"max_runs": 0},
                   {"max_runs": 101}):
        with pytest.raises(ValidationFailed), db.write() as s:
            claim_runs(s, W, **{"max_runs": 1, "lease_seconds": 30, **kwargs})
    # The name runs recorded from traces carry is no claimer's (lease health leaves it out).
    with pytest.raises(ValidationFailed, match="must not start with 'otlp:'"), db.write() as s:
        claim_runs(s, "otlp:checkout")
    assert snapshot_state(db) == before


def test_heartbeat_extends_the_lease_and_reports_cancel(db, agent):
    run_id = post(db, make_session(db)).run_id
    [c] = claim(db, W, lease_seconds=5)
    n_events = len(events(db, run_id))
    hb = beat(db, run_id, lease_seconds=120)
    assert hb.cancel_requested is False
    assert (hb.lease_expires_at - c.lease_expires_at).total_seconds() > 100
    run = run_row(db, run_id)
    assert run.lease_expires_at == hb.lease_expires_at and run.last_heartbeat_at is not None
    assert len(events(db, run_id)) == n_events, "a heartbeat writes no event"

    with db.write() as s:
        request_cancel(s, run_id, requested_by="alice")
    hb = beat(db, run_id)
    assert hb.cancel_requested is True


def test_heartbeat_by_another_executor_is_lease_lost(db, agent):
    run_id = post(db, make_session(db)).run_id
    claim(db, W)
    before = snapshot_state(db)
    with pytest.raises(LeaseLost):
        beat(db, run_id, executor="worker-2")
    assert snapshot_state(db) == before


def test_heartbeat_on_queued_or_terminal_run_is_lease_lost(db, agent):
    run_id = post(db, make_session(db)).run_id
    with pytest.raises(LeaseLost):
        beat(db, run_id)
    claim(db, W)
    finish(db, run_id)
    with pytest.raises(LeaseLost):
        beat(db, run_id)


def test_heartbeat_after_expiry_is_lease_lost(db, agent):
    run_id = post(db, make_session(db)).run_id
    claim(db, W, lease_seconds=600)  # the beat in time cannot be late, however busy the machine
    beat(db, run_id, lease_seconds=600)
    expire_lease(db, run_id)
    before = snapshot_state(db)
    with pytest.raises(LeaseLost):
        beat(db, run_id)
    assert snapshot_state(db) == before
    assert run_row(db, run_id).status == "running"  # expiry is not a failure by itself


def _plan_nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _plan_nodes(child)


@pytest.mark.pg_only
def test_a_long_queue_is_claimed_without_scanning_it_for_each_run(pg_db):
    """The claim's plan is one pass over the queue (the first run of each thread, computed
    once) and, per candidate, one index probe for an active run of its thread and one primary
    key probe for a child's parent, whatever the statistics say of the queue (none are taken
    here: other tests share the database); no join that rescans the queue for every queued
    run, and no hash of every ended run for the parents."""
    from sqlalchemy import text
    from sqlalchemy.dialects import postgresql

    from ingest.leases import _claim_statement

    make_agent(pg_db, "echo", name="Echo")
    runs = [post(pg_db, make_session(pg_db), f"m{i}").run_id for i in range(40)]
    busy = make_session(pg_db)
    post(pg_db, busy, "running")
    waiting = post(pg_db, busy, "waits for the one before").run_id
    with pg_db.write() as s:
        sql = _claim_statement(s).params(max_runs=5).compile(
            dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})
        plan = s.execute(text(f"EXPLAIN (FORMAT JSON) {sql}")).scalar_one()[0]["Plan"]
    nodes = list(_plan_nodes(plan))
    assert not [n for n in nodes if n.get("Join Type") in ("Anti", "Semi")], plan
    probes = [n for n in nodes if n.get("Parent Relationship") == "SubPlan"]
    by_thread = [n for n in probes if "thread_id" in n.get("Index Cond", "")]
    by_parent = [n for n in probes if "parent_run_id" in n.get("Index Cond", "")]
    assert by_thread and by_parent and len(by_thread) + len(by_parent) == len(probes), plan
    assert all(n["Index Name"] == "pk_agent_run" for n in by_parent), plan
    assert [n for n in nodes if n.get("Parent Relationship") == "InitPlan"]

    claimed = [c.run_id for c in claim(pg_db, W, max_runs=50)]
    assert claimed == [*runs, claimed[-1]] and waiting not in claimed
