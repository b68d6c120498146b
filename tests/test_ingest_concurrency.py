"""Concurrent writers: idempotent posts, competing claimers, cancel racing completion.

Written for PostgreSQL (row locks, ``SKIP LOCKED``, the unique constraint settling duplicate
posts); the same tests also run on SQLite, where ``BEGIN IMMEDIATE`` serialises the writers.
"""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import event, func, select
from support.factories import claim, make_agent, make_session, post
from support.ledger import (
    TERMINAL_EVENTS,
    assert_chains_ok,
    assert_run_invariants,
    counts,
    event_types,
)
from support.races import run_together

from agentledger.core.errors import CancelRequested, LedgerError, RunTerminal
from agentledger.core.schema import RunEvent
from ingest.cancel import request_cancel
from ingest.events import append_events
from ingest.leases import claim_runs


def test_concurrent_duplicate_posts_make_exactly_one_run(db):
    make_agent(db, "echo")
    chat = make_session(db)
    results = run_together(50, lambda _i: post(db, chat, "the same message", key="dup-key"))
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors == []
    assert len({r.run_id for r in results}) == 1
    assert len({r.message_id for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    assert counts(db) == {"agent_run": 1, "message": 1, "run_event": 1, "context_blob": 0}
    assert_run_invariants(db, results[0].run_id)


def test_concurrent_conflicting_posts_make_one_run_and_conflicts(db):
    make_agent(db, "echo")
    chat = make_session(db)
    results = run_together(20, lambda i: post(db, chat, f"message {i % 2}", key="dup-key"))
    runs = [r for r in results if not isinstance(r, Exception)]
    errors = [r for r in results if isinstance(r, Exception)]
    assert len({r.run_id for r in runs}) == 1
    assert errors and all(type(e).__name__ == "IdempotencyConflict" for e in errors)
    assert counts(db)["agent_run"] == 1


def test_competing_claimers_never_share_a_run(db):
    make_agent(db, "echo")
    runs = {post(db, make_session(db), f"m{i}").run_id for i in range(200)}
    claimed: list[list[str]] = [[] for _ in range(4)]

    def claimer(i):
        empty = 0
        while empty < 2:
            got = claim(db, f"worker-{i}", max_runs=5)
            claimed[i].extend(c.run_id for c in got)
            empty = 0 if got else empty + 1

    results = run_together(4, claimer)
    assert [r for r in results if isinstance(r, Exception)] == []
    everything = [r for per in claimed for r in per]
    duplicates = [r for r, n in Counter(everything).items() if n > 1]
    assert duplicates == []
    assert set(everything) == runs
    with db.read() as s:
        started = s.execute(
            select(RunEvent.run_id, func.count())
            .where(RunEvent.type == "run.started").group_by(RunEvent.run_id)
        ).all()
    assert len(started) == 200 and all(n == 1 for _, n in started)
    assert_chains_ok(db)


def test_cancel_racing_completion_leaves_exactly_one_terminal_event(db):
    make_agent(db, "echo")
    rounds = 30
    runs = [post(db, make_session(db), f"m{i}").run_id for i in range(rounds)]
    assert len(claim(db, "worker-1", max_runs=rounds)) == rounds
    outcomes = Counter()

    for run_id in runs:
        def cancel(run_id=run_id):
            with db.write() as s:
                return request_cancel(s, run_id, requested_by="alice")

        def complete(run_id=run_id):
            with db.write() as s:
                return append_events(s, run_id, [("message.delta", {"text": "done"}),
                                                  ("run.completed", {})],
                                     executor_instance_id="worker-1").status

        cancelled, completed = run_together(2, lambda i: (cancel, complete)[i]())
        if isinstance(completed, CancelRequested):
            # The cancel won: the executor stops and confirms, exactly as a real one does.
            assert cancelled == "cancelling"
            with db.write() as s:
                append_events(s, run_id, [("run.cancelled", {"external_stop_confirmed": True})],
                              executor_instance_id="worker-1")
            outcomes["cancel first"] += 1
        else:
            assert completed == "succeeded", completed
            assert isinstance(cancelled, RunTerminal), cancelled
            outcomes["completion first"] += 1
        assert not any(isinstance(r, LedgerError) and not isinstance(
            r, CancelRequested | RunTerminal) for r in (cancelled, completed))

        types = event_types(db, run_id)
        assert sum(t in TERMINAL_EVENTS for t in types) == 1, types
        assert types[-1] in ("run.completed", "run.cancelled"), types
        if "run.cancelling" in types:
            assert types[-1] == "run.cancelled"
            assert "run.completed" not in types
        assert_run_invariants(db, run_id)
    assert sum(outcomes.values()) == rounds
    assert_chains_ok(db)


def test_claims_skip_locked_rows_on_postgres(pg_db):
    """While one transaction holds claimed rows, another claimer takes the next ones at once."""
    db = pg_db
    make_agent(db, "echo")
    runs = [post(db, make_session(db), f"m{i}").run_id for i in range(4)]
    with db.write() as first:
        held = [c.run_id for c in claim_runs(first, "worker-1", max_runs=2)]
        # Not committed yet: a second claimer must neither wait nor take the same rows.
        with db.write() as second:
            second.execute(select(1))
            second.connection().exec_driver_sql("SET LOCAL lock_timeout = '2s'")
            other = [c.run_id for c in claim_runs(second, "worker-2", max_runs=4)]
    assert held == runs[:2]
    assert other == runs[2:]


def _rows(db, run_id):
    with db.read() as s:
        from agentledger.core.schema import AgentRun
        run = s.get(AgentRun, run_id)
        stamps = s.execute(
            select(RunEvent.created_at).where(RunEvent.run_id == run_id).order_by(RunEvent.seq)
        ).scalars().all()
        return run.started_at, run.finished_at, stamps


def test_a_claim_begun_before_the_previous_run_ended_starts_after_it_on_postgres(pg_db):
    """Per-thread FIFO in the timestamps too: a claim transaction that began (and was then
    delayed) before the thread's previous run completed is stamped after that completion."""
    db = pg_db
    make_agent(db, "echo")
    chat = make_session(db)
    first, second = post(db, chat, "one").run_id, post(db, chat, "two").run_id
    claim(db, "worker-1", max_runs=1)
    with db.write() as claimer:
        claimer.execute(select(1))  # the claim's transaction is open from here
        with db.write() as s:
            append_events(s, first, [("run.completed", {"content": "done"})],
                          executor_instance_id="worker-1")
        [claimed] = claim_runs(claimer, "worker-2", max_runs=1)
    assert claimed.run_id == second
    _, first_finished, _ = _rows(db, first)
    second_started, _, _ = _rows(db, second)
    assert second_started >= first_finished


def test_event_stamps_follow_seq_when_an_append_waited_for_the_run_lock_on_postgres(pg_db):
    db = pg_db
    make_agent(db, "echo")
    run_id = post(db, make_session(db), "hi").run_id
    claim(db, "worker-1", max_runs=1)
    with db.write() as late:
        late.execute(select(1))
        with db.write() as s:
            append_events(s, run_id, [("message.delta", {"text": "a"})],
                          executor_instance_id="worker-1")
        append_events(late, run_id, [("message.delta", {"text": "b"})],
                      executor_instance_id="worker-1")
    _, _, stamps = _rows(db, run_id)
    assert stamps == sorted(stamps)


def test_a_cancel_the_executor_confirmed_before_its_lock_is_run_terminal_on_postgres(pg_db):
    """The cancel request reads the run unlocked, then locks it: when the executor confirms an
    earlier cancel in between, the run has ended before this request, so it is 409, not 202."""
    db = pg_db
    make_agent(db, "echo")
    run_id = post(db, make_session(db), "hi").run_id
    claim(db, "worker-1", max_runs=1)
    with db.write() as s:
        assert request_cancel(s, run_id, requested_by="alice") == "cancelling"
    confirmed = []

    def confirm_after_the_unlocked_read(conn, cursor, statement, *args):
        # The lock is read through the driver (no SQLAlchemy event): confirm right after the
        # request's first, unlocked read of the run, which saw it ``cancelling``.
        if statement.lstrip().startswith("SELECT agent_run.root_run_id") and not confirmed:
            confirmed.append(True)
            with db.write() as executor:
                append_events(executor, run_id,
                              [("run.cancelled", {"external_stop_confirmed": True})],
                              executor_instance_id="worker-1")

    event.listen(db.engine, "after_cursor_execute", confirm_after_the_unlocked_read)
    try:
        with pytest.raises(RunTerminal, match="cancelled"):
            with db.write() as s:
                request_cancel(s, run_id, requested_by="alice")
    finally:
        event.remove(db.engine, "after_cursor_execute", confirm_after_the_unlocked_read)
    assert confirmed
    types = event_types(db, run_id)
    assert types[-2:] == ["run.cancelling", "run.cancelled"], types
    assert_run_invariants(db, run_id)
