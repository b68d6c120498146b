"""Run creation is rate limited per owner, in the database, with 429 + Retry-After."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from support.api import FlaskApi, assert_error, ledger_state, open_session, send
from support.waiting import wait_until

from agentledger.core import dialect
from agentledger.core.database import Database
from ingest.rate_limits import prune_windows

# A sequence that must land in one window takes a fraction of a second; on a busy machine maybe
# a few. The window is a calendar minute of the database's clock (``ingest.rate_limits``).
SEQUENCE_SECONDS = 10


def seconds_left_in_the_minute(db: Database) -> float:
    with db.read() as s:
        now = dialect.now(s)
    return 60 - now.second - now.microsecond / 1e6


def in_one_window(db: Database) -> None:
    """Return when at least ``SEQUENCE_SECONDS`` remain in the database's current minute (at
    once, five times in six), so the requests that follow count in one rate window."""
    wait_until(lambda: seconds_left_in_the_minute(db) >= SEQUENCE_SECONDS,
               timeout=SEQUENCE_SECONDS + 30, interval=0.1,
               message="a minute with time left for the sequence")


@pytest.fixture
def limited(db: Database, db_url: str):
    app = FlaskApi(db, db_url, run_rate_limit=3)
    yield app
    app.close()


def test_the_fourth_run_in_a_minute_is_refused_and_writes_nothing(limited):
    session = open_session(limited.http, limited.alice)
    in_one_window(limited.db)
    for n in range(3):
        send(limited.http, limited.alice, session["id"], f"m{n}", key=f"rl-{n}")
    before = ledger_state(limited.db)
    reply = send(limited.http, limited.alice, session["id"], "one too many", key="rl-3", expect=None)
    assert_error(reply, 429, "rate_limited")
    retry_after = int(reply.headers["Retry-After"])
    assert 1 <= retry_after <= 60
    assert ledger_state(limited.db) == before


def test_replays_do_not_count_and_owners_are_limited_separately(limited):
    alice = open_session(limited.http, limited.alice)
    bob = open_session(limited.http, limited.bob)
    in_one_window(limited.db)
    for _ in range(3):
        send(limited.http, limited.alice, alice["id"], "same", key="rl-same")
    send(limited.http, limited.alice, alice["id"], "two", key="rl-two")
    send(limited.http, limited.alice, alice["id"], "three", key="rl-three")
    for n in range(3):
        send(limited.http, limited.bob, bob["id"], f"b{n}", key=f"rl-bob-{n}")
    assert_error(send(limited.http, limited.bob, bob["id"], "b3", key="rl-bob-3", expect=None),
                 429, "rate_limited")


def test_zero_turns_the_limit_off(db, db_url):
    app = FlaskApi(db, db_url, run_rate_limit=0)
    try:
        session = open_session(app.http, app.alice)
        for n in range(12):
            send(app.http, app.alice, session["id"], f"m{n}", key=f"off-{n}")
    finally:
        app.close()


def test_old_windows_are_pruned(limited):
    session = open_session(limited.http, limited.alice)
    send(limited.http, limited.alice, session["id"], "x", key="prune-1")
    with limited.db.write() as s:
        assert prune_windows(s) == 0
    with limited.db.write() as s:
        assert prune_windows(s, before=datetime.now(UTC) + timedelta(minutes=2)) == 1
