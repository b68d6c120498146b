"""run_event partitioned by month of run id on PostgreSQL: the upgrade of a database with
history loses nothing (counts, every event's columns, verify), reads of a run or of a window touch
only their partitions (EXPLAIN), partitions are made ahead and emptied months are dropped by the
archive, and the append-only guard holds on the partitions themselves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from support.factories import claim, make_session, post
from support.ledger import fresh_database

from agentledger import demo
from agentledger.core.database import Database
from agentledger.core.event_partitions import (
    DEFAULT_PARTITION,
    add_months,
    ensure_partitions,
    is_partitioned,
    month_partition,
    month_start,
    partitions,
)
from agentledger.core.ids import id_floor, new_id
from agentledger.core.migrate import current_revision, downgrade, upgrade
from agentledger.core.schema import AgentRun
from agentledger.core.vocabulary import NON_TERMINAL
from agentledger.demo_history import synthetic_history
from ingest.bulk_import import bulk_import, iter_runs
from ingest.events import append_events
from queries.agent_outcomes import agent_outcomes, unrecorded_usage
from queries.common import TimeWindow
from queries.outcome_windows import run_conditions
from queries.run_events import events_page

AGENTLEDGER = shutil.which("agentledger")
NOW = datetime.now(UTC)
THIS_MONTH = month_start(NOW)
PREVIOUS_HEAD = "0012"


@pytest.fixture
def pg_fresh(request, tmp_path):
    request.getfixturevalue("pg_database_url")  # skip/fail exactly like the other PG tests
    with fresh_database("postgresql", tmp_path) as url:
        yield url


def id_in(moment: datetime) -> str:
    """A run id recorded at ``moment`` (the ids the ledger made back then)."""
    return id_floor("run", moment) + new_id("x")[-16:]


def write_history(db: Database) -> dict[str, str]:
    """Live runs of this month, imported trees whose roots were recorded three and one months
    ago, and a root with an id of another layout (default partition); returns a few run ids."""
    demo_start = NOW - timedelta(days=2)
    timeline = demo._all_versions_registered(db, demo_start, 2)
    trees = list(synthetic_history(runs=60, start=demo_start, days=2, versions=timeline, seed=7))
    for n, tree in enumerate(trees[:20]):
        tree.id = id_in(add_months(THIS_MONTH, -3) + timedelta(hours=n))
    for n, tree in enumerate(trees[20:40]):
        tree.id = id_in(add_months(THIS_MONTH, -1) + timedelta(hours=n))
    trees[40].id = "run_imported-from-elsewhere-0001"
    bulk_import(db, trees, batch_runs=25)
    live = post(db, make_session(db)).run_id
    claim(db, lease_seconds=3600)  # it writes again after the upgrade, which takes its time
    with db.write() as s:
        append_events(s, live, [("message.delta", {"text": "hi"})],
                      executor_instance_id="worker-1")
    return {"old": trees[0].id, "recent": trees[20].id, "odd": trees[40].id, "live": live,
            # a child of an old root: recorded with the import, this month
            "child": next(r.id for tree in trees[:20] for r in iter_runs(tree.children))}


def every_event(db: Database) -> list[tuple]:
    with db.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT run_id, seq, type, data::text, created_at, hash FROM run_event "
            "ORDER BY run_id, seq"))]


def checksum(db: Database) -> str:
    with db.engine.connect() as conn:
        return conn.execute(text(
            "SELECT md5(string_agg(concat_ws('|', run_id, seq, type, data::text, "
            "created_at::text, hash), E'\\n' ORDER BY run_id, seq)) FROM run_event")).scalar_one()


def verify(url: str) -> subprocess.CompletedProcess:
    return subprocess.run([AGENTLEDGER, "verify"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AGENTLEDGER_DATABASE_URL": url})


def partition_of(db: Database, run_id: str) -> str:
    with db.engine.connect() as conn:
        return conn.execute(text("SELECT DISTINCT tableoid::regclass::text FROM run_event "
                                 "WHERE run_id = :r"), {"r": run_id}).scalar_one()


def scanned_partitions(db: Database, sql: str, params: dict, *, analyze: bool = False) -> set[str]:
    """The run_event partitions a plan reads (with ``analyze``: the ones it actually executed)."""
    option = "ANALYZE, " if analyze else ""
    with db.engine.connect() as conn:
        plan = conn.execute(text(f"EXPLAIN ({option}FORMAT JSON) {sql}"), params).scalar_one()
    found: set[str] = set()

    def walk(node):
        name = node.get("Relation Name", "")
        if name.startswith("run_event") and not (analyze and node.get("Actual Loops") == 0):
            found.add(name)
        for child in node.get("Plans", []):
            walk(child)

    walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    return found


def history_before_partitioning(url: str) -> tuple[Database, dict[str, str]]:
    """``write_history`` by today's write path (which needs today's columns), then the schema
    taken back to the revision before the event log was partitioned: a database as the upgrade
    finds it."""
    upgrade(url)
    db = Database(url)
    try:
        ids = write_history(db)
    finally:
        db.dispose()
    downgrade(url, PREVIOUS_HEAD)
    return Database(url), ids


@pytest.mark.skipif(AGENTLEDGER is None, reason="the agentledger console script is not installed")
def test_upgrade_converts_a_database_with_history_without_loss(pg_fresh):
    db, ids = history_before_partitioning(pg_fresh)
    try:
        with db.engine.connect() as conn:
            assert not is_partitioned(conn)
        assert current_revision(pg_fresh) == PREVIOUS_HEAD
        before, before_sum = every_event(db), checksum(db)
        assert len(before) > 500
        assert verify(pg_fresh).returncode == 0

        done = subprocess.run(
            [AGENTLEDGER, "db", "upgrade"], capture_output=True, text=True, timeout=300,
            env={**os.environ, "AGENTLEDGER_DATABASE_URL": pg_fresh,
                 "AGENTLEDGER_EVENT_COPY_BATCH": "200"})
        assert done.returncode == 0, done.stderr
        progress = [line for line in done.stderr.splitlines() if "events copied" in line]
        assert len(progress) >= len(before) // 200
        assert f"{len(before):,} of {len(before):,} events copied (100 %)" in progress[-1]
        assert f"run_event: {len(before):,} events converted; counts match" in done.stderr

        assert current_revision(pg_fresh) != PREVIOUS_HEAD
        with db.engine.connect() as conn:
            assert is_partitioned(conn)
            names = [p.name for p in partitions(conn)]
        months = [month_partition(add_months(THIS_MONTH, n)).name for n in range(-3, 3)]
        assert names == [*months, DEFAULT_PARTITION]
        assert every_event(db) == before and checksum(db) == before_sum
        assert verify(pg_fresh).returncode == 0
        assert partition_of(db, ids["old"]) == months[0]
        assert partition_of(db, ids["recent"]) == months[2]
        assert partition_of(db, ids["live"]) == months[3]
        assert partition_of(db, ids["child"]) == months[3]
        assert partition_of(db, ids["odd"]) == DEFAULT_PARTITION

        # The ledger goes on writing into the new table, chained to what was copied.
        with db.write() as s:
            append_events(s, ids["live"], [("message.delta", {"text": "!"})],
                          executor_instance_id="worker-1")
        assert verify(pg_fresh).returncode == 0

        # And back: the downgrade puts every event into one plain table again.
        after = every_event(db)
        upgrade_down = subprocess.run(
            [AGENTLEDGER, "db", "upgrade"], capture_output=True, text=True, timeout=300,
            env={**os.environ, "AGENTLEDGER_DATABASE_URL": pg_fresh})
        assert upgrade_down.returncode == 0  # already at head: nothing to do
        downgrade(pg_fresh, PREVIOUS_HEAD)
        with db.engine.connect() as conn:
            assert not is_partitioned(conn)
        assert every_event(db) == after
        assert verify(pg_fresh).returncode == 0
    finally:
        db.dispose()


@pytest.fixture
def history(pg_fresh):
    """A ledger with months of history, converted by the upgrade (months -3 … +2 and default)."""
    db, ids = history_before_partitioning(pg_fresh)
    try:
        upgrade(pg_fresh)
        yield db, ids
    finally:
        db.dispose()


def test_the_append_only_guard_holds_on_every_partition(history):
    db, ids = history
    for run_id in (ids["old"], ids["live"], ids["odd"]):
        table = partition_of(db, run_id)
        for sql in (f"UPDATE {table} SET type = 'x' WHERE run_id = :r",
                    f"DELETE FROM {table} WHERE run_id = :r",
                    "DELETE FROM run_event WHERE run_id = :r"):
            with pytest.raises(DBAPIError, match="append-only"), db.engine.begin() as conn:
                conn.execute(text(sql), {"r": run_id})


def test_a_runs_events_are_read_from_its_partition_only(history):
    db, ids = history
    for run_id in ids.values():
        assert scanned_partitions(
            db, "SELECT seq, type, data FROM run_event WHERE run_id = :r AND seq > 0 ORDER BY seq",
            {"r": run_id}) == {partition_of(db, run_id)}
    # the stream read the API serves, through the query function itself
    with db.read() as s:
        page = events_page(s, ids["old"], after_seq=0)
    assert page is not None and [e["seq"] for e in page.events][:2] == [1, 2]
    # a batch of runs (archive export, evidence bundles): their partitions and no other
    wanted = [ids["old"], ids["odd"]]
    assert scanned_partitions(
        db, "SELECT run_id, seq FROM run_event WHERE run_id IN (:a, :b)",
        {"a": wanted[0], "b": wanted[1]}) == {partition_of(db, r) for r in wanted}


def test_a_time_window_reads_only_the_partitions_of_its_runs(history):
    """The per-agent outcome scan of a window reads the usage events of the window's runs, run
    by run: PostgreSQL prunes that read per run, so partitions holding none of the window's
    runs are never executed."""
    db, ids = history
    window = TimeWindow(start=NOW - timedelta(seconds=60))  # only the live run was made since
    statement = unrecorded_usage([*run_conditions(window, None),
                                  AgentRun.status.in_(NON_TERMINAL)])
    sql = str(statement.compile(db.engine, compile_kwargs={"literal_binds": True}))
    assert scanned_partitions(db, sql, {}, analyze=True) <= {partition_of(db, ids["live"])}
    with db.read() as s:  # and the read itself counts the live run
        outcomes = agent_outcomes(s, window)
    assert sum(o.runs for o in outcomes.agents) == 1


def test_partitions_are_made_ahead_and_a_filled_default_month_is_left_alone(history):
    db, ids = history
    later = add_months(THIS_MONTH, 6)
    stray = id_in(later + timedelta(days=1))  # recorded before anyone made that month
    with db.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE run_event DROP CONSTRAINT fk_run_event_run_id_agent_run")
        conn.execute(text("INSERT INTO run_event (run_id, seq, type, data, created_at, hash) "
                          "VALUES (:r, 1, 'run.queued', '{}', now(), repeat('0', 64))"),
                     {"r": stray})
    assert partition_of(db, stray) == DEFAULT_PARTITION
    with db.engine.begin() as conn:
        created = ensure_partitions(conn, now=add_months(THIS_MONTH, 3) + timedelta(days=10))
    assert created == [month_partition(add_months(THIS_MONTH, n)).name for n in (3, 4, 5)]
    with db.engine.begin() as conn:
        assert ensure_partitions(conn, now=later) == [month_partition(add_months(later, n)).name
                                                      for n in (1, 2)]
        names = {p.name for p in partitions(conn)}
    assert month_partition(later).name not in names
    assert partition_of(db, stray) == DEFAULT_PARTITION
    with db.engine.begin() as conn:
        assert ensure_partitions(conn, now=later) == []


def test_archive_drops_the_months_it_emptied(history, tmp_path):
    db, ids = history
    with db.engine.connect() as conn:
        before = [p.name for p in partitions(conn)]
    oldest = month_partition(add_months(THIS_MONTH, -3)).name
    done = subprocess.run(
        [AGENTLEDGER, "archive", "--older-than-days", "0", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "AGENTLEDGER_DATABASE_URL": db.url})
    assert done.returncode == 0, done.stderr
    with db.engine.connect() as conn:
        after = [p.name for p in partitions(conn)]
        left = conn.execute(text("SELECT count(*) FROM run_event")).scalar_one()
    # Every run of three and of one month ago had ended, and two months ago held none: the
    # three past months are gone; this month stays (the live run), and so do the months ahead
    # and the default.
    emptied = [month_partition(add_months(THIS_MONTH, n)).name for n in (-3, -2, -1)]
    assert emptied[0] == oldest and set(emptied) <= set(before) and not set(emptied) & set(after)
    assert f"dropped 3 emptied run_event partition(s): {', '.join(emptied)}" in done.stdout
    assert month_partition(THIS_MONTH).name in after and DEFAULT_PARTITION in after
    assert left > 0 and partition_of(db, ids["live"]) == month_partition(THIS_MONTH).name
    archive = next(tmp_path.glob("*.jsonl.gz"))
    checked = subprocess.run([AGENTLEDGER, "verify", "--archive", str(archive)],
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "AGENTLEDGER_DATABASE_URL": db.url})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert verify(db.url).returncode == 0
