"""The dashboards' reads can use indexes on PostgreSQL (STYLE 14).

Each query function runs once while its statements are recorded; every recorded statement is
then planned with ``EXPLAIN`` under ``enable_seqscan = off``. A sequential scan of a big table
in that plan means no index can serve the statement: at scale it would read the whole table.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event
from support import history as h

from queries.agent_outcomes import agent_outcomes
from queries.common import TimeWindow
from queries.interrupted_runs import InterruptedFilters, interrupted_runs, interruption_trend
from queries.lease_health import lease_health
from queries.message_search import MessageSearch, search_messages
from queries.outcome_trend import outcome_trend
from queries.overview import overview
from queries.provenance import messages_by_agent_version
from queries.status_timeline import TimelineFilters, status_timeline

BIG_TABLES = ("agent_run", "message", "run_event")
WEEK = TimeWindow(datetime.now(UTC) - timedelta(days=7), None)

READS: dict[str, Callable] = {
    "message search": lambda s: search_messages(s, MessageSearch(text="x", window=WEEK)),
    "message search by session": lambda s: search_messages(s, MessageSearch(session_id="sess_x")),
    "answers of a version": lambda s: messages_by_agent_version(s, "bot", 1),
    "status timeline": lambda s: status_timeline(s, WEEK, TimelineFilters(agent_id="bot")),
    "interrupted runs": lambda s: interrupted_runs(s, InterruptedFilters(window=WEEK)),
    "interruption trend": lambda s: interruption_trend(s, InterruptedFilters(window=WEEK)),
    "lease health": lambda s: lease_health(s),
    "agent outcomes": lambda s: agent_outcomes(s, WEEK),
    "outcome trend": lambda s: outcome_trend(s, WEEK, agent_id="bot"),
    "overview": lambda s: overview(s, WEEK),
}


@pytest.fixture
def seeded(pg_db):
    h.agent(pg_db, "bot")
    chat = h.chat(pg_db, owner="alice", agent_id="bot")
    for n in range(3):
        h.answered(pg_db, chat, "q", "a", owner="alice", when=h.at_seconds(n * 60))
    return pg_db


@pytest.mark.pg_only
@pytest.mark.parametrize("name", list(READS))
def test_reads_can_use_indexes(seeded, name):
    recorded: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            recorded.append((statement, parameters))

    event.listen(seeded.read_engine, "before_cursor_execute", record)
    try:
        with seeded.read() as s:
            READS[name](s)
    finally:
        event.remove(seeded.read_engine, "before_cursor_execute", record)
    assert recorded
    scans = []
    with seeded.read(transaction=True) as s:  # SET LOCAL: for this transaction
        conn = s.connection()
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        for statement, parameters in recorded:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            scans += [f"{t}: {statement[:120]}" for t in BIG_TABLES if f"Seq Scan on {t}" in plan]
    assert scans == []


@pytest.mark.pg_only
def test_outcome_scans_compute_each_duration_once_per_run(seeded):
    """The edge and live-run scans sum, bucket and bound each run's durations: the plan must
    compute them in the scan, once per run, and not inline them into every aggregate that
    names them (which made a busy edge's aggregate several times slower)."""
    recorded: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if "array_agg" in statement:
            recorded.append((statement, parameters))

    event.listen(seeded.read_engine, "before_cursor_execute", record)
    try:
        with seeded.read() as s:
            agent_outcomes(s, WEEK)  # starts inside an hour: an edge scan and a live-run scan
    finally:
        event.remove(seeded.read_engine, "before_cursor_execute", record)
    assert len(recorded) == 2
    with seeded.read() as s:
        conn = s.connection()
        for statement, parameters in recorded:
            lines = [r[0] for r in conn.exec_driver_sql("EXPLAIN VERBOSE " + statement,
                                                         parameters)]
            scan = next(i for i, line in enumerate(lines) if "Scan" in line and "agent_run" in line)
            output = next(line for line in lines[scan + 1:] if line.strip().startswith("Output:"))
            # latency and wait: each expression once, in the scan's output
            assert output.count("date_part") == 2, lines


@pytest.mark.pg_only
def test_the_interruption_trend_reads_only_its_index(seeded):
    """Counting interrupted runs per day and reason reads the partial index that carries the
    reason, not every interrupted run's row."""
    recorded: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        recorded.append((statement, parameters))

    event.listen(seeded.read_engine, "before_cursor_execute", record)
    try:
        with seeded.read() as s:
            interruption_trend(s, InterruptedFilters(window=WEEK, reason="lease_expired",
                                                     agent_id="bot", executor_instance_id="w"))
    finally:
        event.remove(seeded.read_engine, "before_cursor_execute", record)
    [(statement, parameters)] = recorded
    with seeded.read(transaction=True) as s:  # SET LOCAL: for this transaction
        conn = s.connection()
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
        plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
    assert "Index Only Scan using ix_agent_run_interrupted" in plan, plan
