"""AGENTLEDGER_READ_DATABASE_URL: queries read from a replica; read-after-write goes to the primary.

The replica is simulated with a SQLite copy taken at one moment, so replication "lag" is total
and every read can be attributed to one side. On PostgreSQL: a read URL that cannot be reached,
and one that is not a standby. A real streaming replica is in ``test_replica_streaming``.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from support.factories import make_agent, make_session, post
from support.ports import free_port

from agentledger.app_factory import create_app
from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.worker.backends import DatabaseBackend
from ingest.agents import AgentDefinition, add_agent_version
from ingest.tokens import create_token
from queries.agents_catalog import get_agent
from queries.run_states import run_states_read


def _snapshot(primary: str, replica: str) -> None:
    src, dst = sqlite3.connect(primary), sqlite3.connect(replica)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


@pytest.fixture
def replicated(sqlite_template, tmp_path):
    primary = tmp_path / "primary.db"
    replica = tmp_path / "replica.db"
    shutil.copy(sqlite_template, primary)
    settings = Settings(database_url=f"sqlite:///{primary}",
                        read_database_url=f"sqlite:///{replica}", secret_key="replica-test")
    db = Database.from_settings(settings)
    make_agent(db, "echo", name="Echo")
    with db.write() as s:
        _, admin = create_token(s, owner_id="root", role="admin")
    chat = make_session(db, owner="root")
    old_run = post(db, chat, "before the snapshot", owner="root").run_id
    _snapshot(str(primary), str(replica))
    app = create_app(settings, database=db, dashboards=False)
    yield app.test_client(), db, {"Authorization": f"Bearer {admin}"}, chat, old_run
    app.extensions["agentledger"].close()
    db.dispose()


def test_reads_come_from_the_replica(replicated):
    client, db, auth, chat, old_run = replicated
    with db.write() as s:
        add_agent_version(s, "echo", AgentDefinition(name="Echo Renamed", kind="echo"))
    new_run = post(db, chat, "after the snapshot", owner="root").run_id
    assert client.get("/api/agents/echo", headers=auth).get_json()["name"] == "Echo"
    listed = [r["id"] for r in client.get("/api/agent-runs", headers=auth).get_json()["items"]]
    assert listed == [old_run]
    assert new_run not in listed


def test_read_after_write_and_missing_objects_fall_back_to_the_primary(replicated):
    client, db, auth, chat, old_run = replicated
    created = client.post("/api/sessions", json={"agent_id": "echo", "title": "fresh"}, headers=auth)
    assert created.status_code == 201 and created.get_json()["title"] == "fresh"
    fresh = created.get_json()["id"]
    assert client.get(f"/api/sessions/{fresh}", headers=auth).status_code == 200
    renamed = client.put("/api/agents/echo", json={"name": "Echo 2", "kind": "echo"}, headers=auth)
    assert renamed.get_json()["version"] == 2 and renamed.get_json()["name"] == "Echo 2"
    new_run = post(db, chat, "after the snapshot", owner="root").run_id
    assert client.get(f"/api/agent-runs/{new_run}", headers=auth).status_code == 200
    events = client.get(f"/api/agent-runs/{new_run}/events", headers=auth).get_json()
    assert [e["type"] for e in events["events"]] == ["run.queued"]
    assert client.get("/api/agent-runs/run_doesnotexist", headers=auth).status_code == 404


def test_an_executors_read_of_the_runs_it_holds_goes_to_the_primary(replicated):
    _client, db, _auth, chat, old_run = replicated
    new_run = post(db, chat, "after the snapshot", owner="root").run_id
    asked = run_states_read([old_run, new_run], postgres=db.is_postgres)
    assert sorted(r.id for r in db.read_rows(*asked)) == [old_run]  # the replica's copy
    assert sorted(r.id for r in db.read_rows(*asked, primary=True)) == sorted([old_run, new_run])
    states = DatabaseBackend(db, "worker-1").run_states([old_run, new_run])
    assert {run_id: s.status for run_id, s in states.items()} == {old_run: "queued",
                                                                   new_run: "queued"}


def test_the_replica_connection_refuses_writes(replicated):
    _client, db, _auth, _chat, _old_run = replicated
    with pytest.raises(OperationalError):
        with db.read() as s:
            s.execute(text("DELETE FROM api_token"))


def _reads_everywhere(db: Database) -> list[str]:
    with db.read() as s:
        via_read = get_agent(s, "echo")["name"]
    names = text("SELECT name FROM agent_version WHERE agent_id = 'echo'")
    via_rows = db.read_rows(names, fresh=True)[0].name
    row = db.read_row(names)
    return [via_read, via_rows, row.name]


def test_an_unreachable_postgres_replica_leaves_reads_to_the_primary(pg_url, caplog):
    db = Database(pg_url, f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/postgres",
                  replica_retry_seconds=60)
    try:
        make_agent(db, "echo", name="Echo")
        with caplog.at_level(logging.WARNING, logger="agentledger.core.database"):
            for _ in range(5):
                assert _reads_everywhere(db) == ["Echo"] * 3
        warnings = [r for r in caplog.records if "read replica unreachable" in r.getMessage()]
        assert len(warnings) == 1, warnings  # once per back-off, not once per read
    finally:
        db.dispose()


def test_a_postgres_read_url_that_is_not_a_standby_is_read_as_it_is(pg_url, caplog):
    db = Database(pg_url, pg_url)  # the primary itself: never in recovery
    try:
        with caplog.at_level(logging.DEBUG, logger="agentledger.core.database"):
            make_agent(db, "echo", name="Echo")
            assert _reads_everywhere(db) == ["Echo"] * 3
            with db.read() as s:
                served_by = s.execute(text("SELECT current_setting('application_name')")).scalar()
        # served by the read URL, not the primary; when not, say why the read fell back
        assert served_by == "agentledger-replica-read", (
            served_by, db.replica_gate.available, [r.getMessage() for r in caplog.records])
    finally:
        db.dispose()
