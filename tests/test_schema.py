"""The schema: migrations match the models, and the database itself protects history."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import DBAPIError
from support.factories import claim, make_agent, make_session, post
from support.ledger import assert_chains_ok, events, fresh_database, run_row

from agentledger.core.database import Database
from agentledger.core.event_partitions import is_event_partition
from agentledger.core.migrate import alembic_config, current_revision, upgrade
from agentledger.core.schema import Base, exists_on
from ingest.events import append_events


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request, tmp_path):
    if request.param == "postgresql":
        request.getfixturevalue("pg_database_url")  # skip/fail exactly like the other PG tests
    with fresh_database(request.param, tmp_path) as url:
        yield url


def schema_diff(url: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={
                "compare_type": True,
                "compare_server_default": True,
                "include_object": lambda obj, *_: exists_on(obj, conn.dialect.name),
            })
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


def test_migrations_create_exactly_the_models(fresh_url):
    upgrade(fresh_url)
    assert schema_diff(fresh_url) == []
    engine = create_engine(fresh_url)
    try:
        tables = {name for name in inspect(engine).get_table_names()
                  if not is_event_partition(name)} - {"alembic_version"}
    finally:
        engine.dispose()
    assert tables == set(Base.metadata.tables)


def test_upgrade_is_idempotent_and_downgrade_reverses_it(fresh_url):
    assert current_revision(fresh_url) is None
    upgrade(fresh_url)
    head = current_revision(fresh_url)
    assert head is not None
    upgrade(fresh_url)
    assert current_revision(fresh_url) == head

    engine = create_engine(fresh_url)
    try:
        with engine.begin() as conn:
            cfg = alembic_config(fresh_url)
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
    upgrade(fresh_url)
    assert schema_diff(fresh_url) == []
    db = Database(fresh_url)
    try:  # the triggers came back with the tables
        make_agent(db)
        post(db, make_session(db))
        with pytest.raises(DBAPIError), db.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM run_event")
    finally:
        db.dispose()


# --- the database refuses to rewrite history -------------------------------------------------


@pytest.fixture
def history(db):
    make_agent(db, "echo")
    run_id = post(db, make_session(db), "hello").run_id
    claim(db, "worker-1")
    with db.write() as s:
        append_events(s, run_id, [("message.delta", {"text": "hi"})],
                      executor_instance_id="worker-1")
    return run_id


def refused(db, sql: str, **params) -> str:
    with pytest.raises(DBAPIError) as info, db.engine.begin() as conn:
        conn.execute(text(sql), params)
    return str(info.value.orig)


@pytest.mark.parametrize("sql", [
    "UPDATE run_event SET type = 'run.completed' WHERE run_id = :r AND seq = 3",
    "UPDATE run_event SET data = '{}' WHERE run_id = :r",
    "UPDATE run_event SET hash = 'x' WHERE run_id = :r AND seq = 1",
    "UPDATE run_event SET seq = seq + 100 WHERE run_id = :r",
    "DELETE FROM run_event WHERE run_id = :r AND seq = 3",
    "DELETE FROM run_event",
])
def test_run_event_update_and_delete_are_refused(db, history, sql):
    before = events(db, history)
    message = refused(db, sql, r=history)
    assert "append-only" in message
    assert events(db, history) == before
    assert_chains_ok(db)


@pytest.mark.parametrize("column, value", [
    ("agent_execution_snapshot", '{"agent_id": "evil", "name": "Evil", "version": 99}'),
    ("context_pack_snapshot", '{"items": [], "pack_hash": "0"}'),
])
def test_run_snapshots_cannot_change(db, history, column, value):
    before = run_row(db, history)
    message = refused(db, f"UPDATE agent_run SET {column} = :v WHERE id = :r", v=value, r=history)
    assert "immutable" in message
    message = refused(
        db, f"UPDATE agent_run SET {column} = :v, error = NULL WHERE id = :r", v=value, r=history
    )
    assert "immutable" in message
    assert run_row(db, history) == before


def test_other_run_columns_can_still_be_updated(db, history):
    with db.engine.begin() as conn:
        done = conn.execute(
            text("UPDATE agent_run SET executor_instance_id = 'someone-else', "
                 "agent_execution_snapshot = agent_execution_snapshot WHERE id = :r"),
            {"r": history},
        )
        assert done.rowcount == 1
    assert run_row(db, history).executor_instance_id == "someone-else"
    # The write path's own updates (status, seq, lease) keep working.
    with db.write() as s:
        append_events(s, history, [("run.interrupted", {"reason": "executor_shutdown"})])
    assert run_row(db, history).status == "interrupted"


def test_agent_versions_are_immutable(db, history):
    refused(db, "UPDATE agent_version SET name = 'Renamed' WHERE agent_id = 'echo'")
    refused(db, "DELETE FROM agent_version WHERE agent_id = 'echo'")
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM agent_version")).scalars().all() == ["Echo"]


@pytest.mark.pg_only
def test_a_migration_kept_waiting_for_a_lock_names_the_session_that_holds_it(
        pg_url, monkeypatch, capsys):
    """A session that holds what the migration needs (here the migrations' advisory lock, as
    another migrating process or a session idle in its transaction would) makes ``upgrade``
    wait; past the notice delay it says who, once, on stderr, and it goes on when the session
    commits."""
    import re
    import threading
    import time

    import psycopg

    from agentledger.core import lock_waits

    monkeypatch.setattr(lock_waits, "NOTICE_AFTER_SECONDS", 0.3)
    monkeypatch.setattr(lock_waits, "POLL_SECONDS", 0.1)
    holder = psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://"))
    holder.execute("SET application_name = 'a forgotten psql'")
    holder.execute("SELECT pg_advisory_xact_lock(724311)")  # left open in its transaction
    pid = holder.info.backend_pid
    done = threading.Event()
    migrating = threading.Thread(target=lambda: (upgrade(pg_url), done.set()))
    migrating.start()
    try:
        seen, deadline = "", time.monotonic() + 30
        while "waits for a lock" not in seen and time.monotonic() < deadline:
            time.sleep(0.1)
            seen += capsys.readouterr().err
        assert not done.is_set()  # it waits: nothing is cancelled
        assert re.fullmatch(
            rf"agentledger: the migration waits for a lock held by PostgreSQL session {pid} "
            r"\(a forgotten psql, idle in transaction, its transaction open \d+ s\); it goes on "
            rf"once that session commits or ends \(SELECT pg_terminate_backend\({pid}\) ends "
            r"it\)\n", seen), seen
    finally:
        holder.commit()
        holder.close()
        migrating.join(timeout=30)
    assert done.is_set()
    assert capsys.readouterr().err == ""  # one line per session, not one per look
