"""An executor's append as a transaction of its own (``ingest.events.append_events_alone``).

On PostgreSQL a batch that does not end the run is one statement after an unlocked read of the
run's head: these tests make another writer move the head in between (from inside the spy that
sees the append's statements) and check that the append starts again from the new head, that
seqs stay gapless, hashes chained and stamps in seq order, and that it falls back to the row
lock after losing again and again. The same concurrency test runs on SQLite, where the append
is an ordinary write transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import select, text
from support.factories import claim, make_agent, make_session, post
from support.ledger import assert_chains_ok, assert_run_invariants, events
from support.statements import statements_sent

from agentledger.core.errors import IllegalTransition, LeaseLost, NotFound
from agentledger.core.schema import RunEvent
from ingest.cancel import request_cancel
from ingest.events import append_events, append_events_alone

DELTA = ("message.delta", {"text": "mine"})
# The row lock every locked path takes on PostgreSQL (agentledger.core.dialect.for_update).
ROW_LOCK = "FOR NO KEY UPDATE"


def _running_run(db) -> str:
    make_agent(db, "echo")
    run_id = post(db, make_session(db), "hi").run_id
    claim(db, "worker-1", max_runs=1)
    return run_id


def _stamps(db, run_id: str) -> list:
    with db.read() as s:
        return list(s.execute(select(RunEvent.created_at).where(RunEvent.run_id == run_id)
                              .order_by(RunEvent.seq)).scalars())


@contextmanager
def competing_write(db):
    """Another writer's transaction; it gives up on a row lock held by the append under test
    (which would otherwise wait for it in this same thread) instead of waiting forever."""
    with db.write() as s:
        s.execute(text("SET LOCAL lock_timeout = '5s'"))
        yield s


@contextmanager
def before_each_advance(db, act: Callable[[int], None]) -> Iterator[list[str]]:
    """Call ``act(n)`` (n = 1, 2, …) just before each head advance the block sends on
    PostgreSQL, then send it: another writer moves the head between the read and the write."""
    advances: list[str] = []
    busy = threading.local()

    def intercept(sql: str) -> None:
        if "UPDATE agent_run" in sql and not getattr(busy, "on", False):
            advances.append(sql)
            busy.on = True
            try:
                act(len(advances))
            finally:
                busy.on = False

    with statements_sent(db, before=intercept):
        yield advances


def test_an_append_alone_is_its_head_read_and_one_unlocked_statement_on_postgres(pg_db):
    run_id = _running_run(pg_db)
    with statements_sent(pg_db) as sent:
        result = append_events_alone(pg_db, run_id, [DELTA], executor_instance_id="worker-1")
    assert result.seqs == [3] and result.status == "running" and not result.cancel_requested
    assert len(sent) == 2, sent
    head, advance = sent
    assert head.lstrip().startswith("SELECT") and ROW_LOCK not in head
    assert "UPDATE agent_run" in advance and "INSERT INTO run_event" in advance
    assert [e.data for e in events(pg_db, run_id)][-1] == {"text": "mine"}
    assert_chains_ok(pg_db, run_id)


@pytest.mark.parametrize("size", [1, 5])
@pytest.mark.parametrize("competitor", ["delta", "cancel"])
def test_an_append_alone_that_lost_its_head_starts_again_from_the_new_one_on_postgres(
        pg_db, competitor, size):
    run_id = _running_run(pg_db)
    batch = [DELTA] * size

    def move_head(n: int) -> None:
        if n > 1:
            return
        with competing_write(pg_db) as s:
            if competitor == "delta":
                append_events(s, run_id, [("message.delta", {"text": "theirs"})],
                              executor_instance_id="worker-1")
            else:
                request_cancel(s, run_id, requested_by="alice")

    failed: list[tuple[str, str | None]] = []
    with statements_sent(pg_db, failed=failed), before_each_advance(pg_db, move_head) as advances:
        result = append_events_alone(pg_db, run_id, batch, executor_instance_id="worker-1")
    assert len(advances) == 2  # ours, lost to the competitor's; ours again, from its head
    # Losing is not an error: the lost attempt wrote nothing and the server refused nothing
    # (no unique violation on the competitor's seq in the server's log).
    assert failed == []
    stored = events(pg_db, run_id)
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    assert [e.data for e in stored[-size:]] == [{"text": "mine"}] * size
    assert result.seqs == [e.seq for e in stored[-size:]]
    assert stored[-size - 1].type == ("message.delta" if competitor == "delta"
                                      else "run.cancelling")
    assert result.cancel_requested is (competitor == "cancel")
    assert result.status == ("running" if competitor == "delta" else "cancelling")
    assert _stamps(pg_db, run_id) == sorted(_stamps(pg_db, run_id))
    assert_chains_ok(pg_db, run_id)
    assert_run_invariants(pg_db, run_id)


def test_an_append_alone_that_keeps_losing_takes_the_row_lock_on_postgres(pg_db):
    run_id = _running_run(pg_db)

    def move_head(n: int) -> None:
        if n > 3:  # the fourth advance is the locked path's: a competitor would wait for us
            return
        with competing_write(pg_db) as s:
            append_events(s, run_id, [("message.delta", {"text": "theirs"})],
                          executor_instance_id="worker-1")

    with statements_sent(pg_db) as sent, before_each_advance(pg_db, move_head):
        result = append_events_alone(pg_db, run_id, [DELTA], executor_instance_id="worker-1")
    stored = events(pg_db, run_id)
    # Three optimistic attempts lost, each to one competing delta; then the row lock.
    assert any(ROW_LOCK in q for q in sent)
    assert [e.data["text"] for e in stored if e.type == "message.delta"] == ["theirs"] * 3 + ["mine"]
    assert [e.data["text"] for e in stored if e.type == "message.delta"].count("mine") == 1
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    assert result.seqs == [next(e.seq for e in stored if e.data.get("text") == "mine")]
    assert _stamps(pg_db, run_id) == sorted(_stamps(pg_db, run_id))
    assert_chains_ok(pg_db, run_id)


def test_concurrent_appends_alone_to_one_run_get_gapless_seqs_and_one_chain(db):
    run_id = _running_run(db)
    threads, each = 8, 15
    barrier = threading.Barrier(threads)
    got: list[list[int]] = [[] for _ in range(threads)]
    failures: list[BaseException] = []

    def appender(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            for k in range(each):
                result = append_events_alone(
                    db, run_id, [("message.delta", {"text": f"{i}-{k}"})] * (1 + k % 3),
                    executor_instance_id="worker-1")
                got[i].extend(result.seqs)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    workers = [threading.Thread(target=appender, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert failures == []
    stored = events(db, run_id)
    expected = threads * sum(1 + k % 3 for k in range(each))
    assert len(stored) == 2 + expected
    assert sorted(s for seqs in got for s in seqs) == list(range(3, 3 + expected))
    for i in range(threads):  # each caller's batches went in whole, in its own order
        texts = [e.data["text"] for e in stored if e.data.get("text", "").startswith(f"{i}-")]
        assert texts == [f"{i}-{k}" for k in range(each) for _ in range(1 + k % 3)]
    assert _stamps(db, run_id) == sorted(_stamps(db, run_id))
    assert_chains_ok(db, run_id)
    assert_run_invariants(db, run_id)


def test_an_append_alone_refuses_as_append_events_does_and_writes_nothing(db):
    run_id = _running_run(db)
    before = events(db, run_id)
    with pytest.raises(LeaseLost):
        append_events_alone(db, run_id, [DELTA], executor_instance_id="worker-2")
    with pytest.raises(IllegalTransition):
        append_events_alone(db, run_id, [DELTA, ("run.started", {"executor_instance_id": "x"})],
                            executor_instance_id="worker-1")
    with pytest.raises(NotFound):
        append_events_alone(db, "run_missing", [DELTA], executor_instance_id="worker-1")
    assert events(db, run_id) == before


def test_an_ending_appended_alone_goes_through_the_row_lock_and_ends_the_run(db):
    run_id = _running_run(db)
    with statements_sent(db) as sent:
        result = append_events_alone(db, run_id, [DELTA, ("run.completed", {})],
                                     executor_instance_id="worker-1")
    assert result.status == "succeeded" and result.final_message_id
    if db.is_postgres:
        assert any(ROW_LOCK in q for q in sent)
    assert_run_invariants(db, run_id)
