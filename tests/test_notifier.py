"""The process's notifier on PostgreSQL: a commit of this process wakes its waiters once (from
``Database.write``, its echo through ``LISTEN`` skipped); another process's commit wakes them
through ``LISTEN``."""

from __future__ import annotations

import time

import pytest

from agentledger.core import dialect
from agentledger.core.database import Database
from agentledger.core.notifier import EventNotifier

SETTLE = 0.5  # long enough for an echo through LISTEN to arrive on an idle machine


def _until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@pytest.fixture
def listening(pg_db):
    notifier = EventNotifier(pg_db.url, is_postgres=True)
    notifier.hear_commits_of(pg_db)
    notifier.subscribe("run_x")
    assert _until(lambda: notifier.fallback_timeout == 1.0), "the LISTEN thread did not start"
    time.sleep(0.1)  # the wake-up of its first LISTEN is counted before the test starts
    yield notifier
    notifier.stop()


def test_a_commit_of_this_process_wakes_its_waiters_once(pg_db, listening):
    before = listening.generation("run_x")
    with pg_db.write() as s:
        dialect.notify(s, dialect.EVENTS_CHANNEL, "run_x")
    assert listening.generation("run_x") == before + 1  # at once, from the commit
    time.sleep(SETTLE)
    assert listening.generation("run_x") == before + 1  # the echo did not wake it again

    queue = listening.queue_generation()
    with pg_db.write() as s:
        dialect.notify(s, dialect.QUEUE_CHANNEL, "run_y")
    time.sleep(SETTLE)
    assert listening.queue_generation() == queue + 1


def test_a_commit_of_another_process_wakes_them_through_listen(pg_db, pg_url, listening):
    other = Database(pg_url)  # another process's connections
    try:
        before = listening.generation("run_x")
        with other.write() as s:
            dialect.notify(s, dialect.EVENTS_CHANNEL, "run_x")
        assert _until(lambda: listening.generation("run_x") == before + 1)
        time.sleep(SETTLE)
        assert listening.generation("run_x") == before + 1
    finally:
        other.dispose()


def test_the_write_connections_server_processes_are_tracked_while_open(pg_db):
    with pg_db.write() as s:
        pid = s.connection().connection.driver_connection.info.backend_pid
    assert pg_db.writes_through(pid)
    assert not pg_db.writes_through(pid + 1_000_000)
    pg_db.dispose()
    # closed: that process id may serve another client of the server now
    assert not pg_db.writes_through(pid)
