"""Migrations on real databases: the state machine's ground held by the database itself, and an
old database upgraded with its history (the frozen backfill equals a scan of the runs)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from support import history as h
from support.rollup import assert_rollup_matches_scan
from test_outcome_rollup import random_lifecycles

from agentledger.core.migrate import current_revision, downgrade, upgrade


def _one_run(db) -> str:
    h.agent(db, "alpha")
    chat = h.chat(db, owner="alice", agent_id="alpha")
    return h.ask(db, chat, "q", owner="alice", when=h.T0).run_id


def _raw(db_url: str, sql: str, **params) -> None:
    from agentledger.core.database import normalize_url

    engine = sa.create_engine(normalize_url(db_url))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(sql), params)
    finally:
        engine.dispose()


@pytest.mark.parametrize("status", ["done", "", "QUEUED"])
def test_the_database_refuses_a_status_outside_the_seven(db, db_url, status):
    run_id = _one_run(db)
    with pytest.raises(DBAPIError):
        _raw(db_url, "UPDATE agent_run SET status = :s, last_event_seq = last_event_seq + 1 "
             "WHERE id = :id", s=status, id=run_id)
    with pytest.raises(DBAPIError):
        _raw(db_url, "INSERT INTO agent_run (id, thread_id, root_run_id, owner_id, agent_id, "
             "agent_version, status, agent_execution_snapshot, context_pack_snapshot, "
             "last_event_seq, last_event_hash, created_at) SELECT 'run_x', thread_id, 'run_x', "
             "owner_id, agent_id, agent_version, :s, agent_execution_snapshot, "
             "context_pack_snapshot, 0, last_event_hash, created_at FROM agent_run WHERE id = :id",
             s=status, id=run_id)
    with db.read() as s:
        assert s.execute(sa.text("SELECT status FROM agent_run")).scalars().all() == ["queued"]


def test_a_status_change_without_its_event_is_refused(db, db_url):
    run_id = _one_run(db)
    for sql in ("UPDATE agent_run SET status = 'succeeded' WHERE id = :id",
                "UPDATE agent_run SET status = 'running', last_event_seq = last_event_seq "
                "WHERE id = :id",
                "UPDATE agent_run SET status = 'cancelled', last_event_seq = 0 WHERE id = :id"):
        with pytest.raises(DBAPIError):
            _raw(db_url, sql, id=run_id)
    # other columns may change (leases are renewed without an event), and so may a status
    # whose statement advances the head
    _raw(db_url, "UPDATE agent_run SET executor_instance_id = 'w' WHERE id = :id", id=run_id)
    _raw(db_url, "UPDATE agent_run SET status = 'queued' WHERE id = :id", id=run_id)
    with db.read() as s:
        row = s.execute(sa.text("SELECT status, executor_instance_id FROM agent_run")).one()
    assert tuple(row) == ("queued", "w")


def test_an_old_database_upgrades_with_its_history_and_the_backfilled_rollup(db, db_url):
    random_lifecycles(db, random.Random(11), 30)
    before = assert_rollup_matches_scan(db)
    upgraded_from = datetime.now(UTC)
    downgrade(db_url, "0006")
    assert current_revision(db_url) == "0006"
    upgrade(db_url)
    assert current_revision(db_url) != "0006"
    # 0007 rebuilt both rollups from the runs (frozen SQL, not today's write path); 0014 left
    # the runs' usage totals unrecorded (the outcome reads sum those runs' events)
    # (0017 backfilled the minute rollup with the minutes kept when it ran: none of these)
    assert assert_rollup_matches_scan(db, usage_recorded=False,
                                      imported_since=upgraded_from) == before


def test_the_minute_rollup_is_backfilled_with_the_runs_of_the_minutes_kept(db, db_url):
    from datetime import timedelta

    from support.rollup import stored

    from agentledger.core.schema import AgentRun

    h.agent(db, "alpha")
    chat = h.chat(db, owner="alice", agent_id="alpha")
    now = datetime.now(UTC)
    recent = []
    for n, when in enumerate([now - timedelta(days=3), now - timedelta(hours=30),
                              now - timedelta(hours=2), now - timedelta(hours=2, seconds=-20),
                              now - timedelta(minutes=5)]):
        run = h.ask(db, chat, "q", owner="alice", when=when).run_id
        h.start(db, run, when + timedelta(seconds=1))
        h.usage(db, run, when + timedelta(seconds=2), 10 + n, 2, 0.25)
        if n % 2:
            h.fail(db, run, when + timedelta(seconds=3))
        else:
            h.complete(db, run, when + timedelta(seconds=3), "a")
        recent.append(run)
    with db.write() as s:  # as if they ended before usage totals were recorded on the row
        s.execute(sa.update(AgentRun).where(AgentRun.id == recent[2])
                  .values(usage_input_tokens=None, usage_output_tokens=None, usage_cost_usd=None))
    live = stored(db, "minute")
    assert len(live) == 5  # the live path keeps every run's minute (each ended at once)

    downgrade(db_url, "0016")
    upgrade(db_url)
    backfilled = stored(db, "minute")
    # the run created three days ago is before the minutes kept; the others are as they were
    assert set(backfilled) == set(live) - {k for k in live if k[2] < now - timedelta(days=2)}
    assert len(backfilled) == 4
    # the same sums, the NULLed run's usage read from its events
    assert backfilled == {k: v for k, v in live.items() if k in backfilled}


def test_the_interruption_counts_are_backfilled_from_the_interrupted_runs(db, db_url):
    from queries.metrics import interrupted_by_reason

    h.agent(db, "alpha")
    now = datetime.now(UTC)
    for n, reason in enumerate(["service_restart", "lease_expired", "lease_expired"]):
        chat = h.chat(db, owner="alice", agent_id="alpha")
        run = h.ask(db, chat, "q", owner="alice", when=now).run_id
        h.start(db, run, now, f"w-{n}")
        h.executor_gone(db, f"w-{n}", now, reason)
    with db.read() as s:
        live = interrupted_by_reason(s)
    assert (live["service_restart"], live["lease_expired"], live["parent_terminal"]) == (1, 2, 0)
    downgrade(db_url, "0017")
    upgrade(db_url)
    with db.read() as s:
        assert interrupted_by_reason(s) == live
