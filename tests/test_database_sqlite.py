"""SQLite in one process: writers take turns on an in-process lock before ``BEGIN IMMEDIATE``
(not in SQLite's sleeping busy handler), and a read that is one statement begins no
transaction, still refused any write."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.exc import DBAPIError

from agentledger.core import sqlite_writers
from agentledger.core.database import Database
from agentledger.core.schema import ApiToken
from ingest.tokens import create_token


@pytest.fixture
def sqlite_url(tmp_path, sqlite_template) -> str:
    target = tmp_path / "ledger.db"
    shutil.copy(sqlite_template, target)
    return f"sqlite:///{target}"


@pytest.fixture
def sqlite_db(sqlite_url):
    database = Database(sqlite_url)
    yield database
    database.dispose()


def _begins(engine) -> list[str]:
    seen: list[str] = []
    event.listen(engine, "begin", lambda connection: seen.append(threading.current_thread().name))
    return seen


def test_a_waiting_writer_begins_only_when_the_writer_before_it_has_committed(sqlite_db):
    begins = _begins(sqlite_db.engine)
    holding, release = threading.Event(), threading.Event()
    entered_at: list[float] = []
    committed_at: list[float] = []

    def first():
        with sqlite_db.write() as s:
            create_token(s, owner_id="first", role="user")
            holding.set()
            release.wait(10)
        committed_at.append(time.monotonic())

    def second():
        holding.wait(10)
        with sqlite_db.write() as s:
            entered_at.append(time.monotonic())
            create_token(s, owner_id="second", role="user")

    threads = [threading.Thread(target=first, name="first"),
               threading.Thread(target=second, name="second")]
    for t in threads:
        t.start()
    holding.wait(10)
    time.sleep(0.3)  # time enough for the second writer to reach its BEGIN, were it let
    # It waits for its turn in this process: it has not begun a SQLite transaction (where it
    # would sit in the busy handler, polling).
    assert begins == ["first"]
    release.set()
    for t in threads:
        t.join(10)
    assert begins == ["first", "second"]
    assert entered_at[0] >= committed_at[0] - 0.05  # after the first one's commit, not during it
    with sqlite_db.read() as s:
        assert sorted(s.scalars(select(ApiToken.owner_id))) == ["first", "second"]


def test_databases_on_the_same_file_share_the_turns(sqlite_url, tmp_path):
    one = Database(sqlite_url)
    other = Database(f"sqlite:///{tmp_path}/../{tmp_path.name}/ledger.db")
    elsewhere = Database(f"sqlite:///{tmp_path}/elsewhere.db")
    try:
        assert one._writer_turns is other._writer_turns
        assert one._writer_turns is not elsewhere._writer_turns
        with one.write():
            assert other._writer_turns.locked()
        assert not other._writer_turns.locked()
    finally:
        for database in (one, other, elsewhere):
            database.dispose()


def test_a_turn_not_granted_in_time_leaves_the_wait_to_sqlite(sqlite_db, monkeypatch):
    """A writer of this process that never gives its turn back (stuck) does not block the others
    for ever: after BUSY_TIMEOUT_SECONDS they go on to BEGIN IMMEDIATE, as without the turns."""
    monkeypatch.setattr(sqlite_writers, "BUSY_TIMEOUT_SECONDS", 0.2)
    sqlite_db._writer_turns.acquire()
    try:
        started = time.monotonic()
        with sqlite_db.write() as s:
            create_token(s, owner_id="after-a-stuck-turn", role="user")
        assert time.monotonic() - started >= 0.2
        assert sqlite_db._writer_turns.locked()  # still the stuck holder's; not released by us
    finally:
        sqlite_db._writer_turns.release()
    with sqlite_db.read() as s:
        assert s.scalars(select(ApiToken.owner_id)).all() == ["after-a-stuck-turn"]


def test_a_failed_write_gives_its_turn_back(sqlite_db):
    with pytest.raises(RuntimeError), sqlite_db.write() as s:
        create_token(s, owner_id="rolled-back", role="user")
        raise RuntimeError("the request failed")
    assert not sqlite_db._writer_turns.locked()
    with sqlite_db.write() as s:
        create_token(s, owner_id="next", role="user")
    with sqlite_db.read() as s:
        assert s.scalars(select(ApiToken.owner_id)).all() == ["next"]


def test_a_single_statement_read_begins_no_transaction_and_still_refuses_writes(sqlite_db):
    with sqlite_db.write() as s:
        create_token(s, owner_id="reader", role="viewer")
    statements: list[str] = []
    event.listen(sqlite_db.read_engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: statements.append(statement))
    row = sqlite_db.read_row(select(ApiToken.owner_id, ApiToken.role))
    assert (row.owner_id, row.role) == ("reader", "viewer")
    assert [r.owner_id for r in sqlite_db.read_rows(select(ApiToken.owner_id))] == ["reader"]
    assert len(statements) == 2
    assert not any(s.strip().upper().startswith(("BEGIN", "COMMIT")) for s in statements)
    with pytest.raises(DBAPIError, match="readonly|read-only|query_only"):
        sqlite_db.read_rows(text("DELETE FROM api_token RETURNING id"))
    assert sqlite_db.read_row(select(ApiToken.owner_id)).owner_id == "reader"


def test_a_read_in_a_session_still_reads_in_one_transaction(sqlite_db):
    """``Database.read()`` (several statements) keeps its BEGIN: one snapshot for all of them."""
    statements: list[str] = []
    event.listen(sqlite_db.read_engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: statements.append(statement))
    with sqlite_db.read() as s:
        s.execute(text("SELECT 1"))
        s.execute(text("SELECT 2"))
    assert statements[0] == "BEGIN"
