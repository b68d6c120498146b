"""Tampering behind the application's back is detected: ``verify_chains`` and ``agentledger verify``.

The append-only triggers are dropped first (an attacker with database access can do that);
on PostgreSQL, where the database is shared by the test session, they are put back afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from sqlalchemy import select, text
from support.factories import answered_run, make_agent, make_session, post
from support.ledger import fresh_database
from support.triggers import dropped_trigger

from agentledger.core.database import Database
from agentledger.core.hashing import token_hash
from agentledger.core.schema import ApiToken
from queries import chain_verification
from queries.chain_verification import ChainProblem, verify_chains

AGENTLEDGER = shutil.which("agentledger")


@pytest.fixture
def unguarded(db):
    """Drop the run_event triggers for this test; restore them afterwards on PostgreSQL."""
    with dropped_trigger(db, "run_event_append_only", "run_event",
                         sqlite_names=("run_event_no_update", "run_event_no_delete")):
        yield db


@pytest.fixture
def ledger(unguarded):
    """Three finished runs of 5 events each: a, b (the victim) and c."""
    db = unguarded
    make_agent(db, "echo")
    return [answered_run(db, f"question {name}", [
        ("message.delta", {"text": f"answer {name}"}),
        ("usage", {"input_tokens": 1, "output_tokens": 2, "cost_usd": 0.5}),
        ("run.completed", {})]) for name in "abc"]


def tamper(db, sql: str, **params) -> None:
    with db.engine.begin() as conn:
        assert conn.execute(text(sql), params).rowcount >= 1


def problems(db, run_id=None, run_ids=None) -> list[tuple[str, int]]:
    with db.read(transaction=run_id is None and run_ids is None) as s:
        report = verify_chains(s, run_id=run_id, run_ids=run_ids)
    return [(p.run_id, p.seq) for p in report.problems]


def cli(db_url: str, *args: str) -> subprocess.CompletedProcess:
    assert AGENTLEDGER, "the agentledger console script is not installed"
    env = {**os.environ, "AGENTLEDGER_DATABASE_URL": db_url}
    return subprocess.run([AGENTLEDGER, *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_clean_ledger_verifies(unguarded, ledger):
    with unguarded.read(transaction=True) as s:
        report = verify_chains(s)
    assert report.ok and report.runs_checked == 3 and report.events_checked == 15


@pytest.mark.parametrize("sql, seq", [
    ("UPDATE run_event SET data = :d WHERE run_id = :r AND seq = 3", 3),
    ("UPDATE run_event SET type = 'tool.call' WHERE run_id = :r AND seq = 4", 4),
    ("UPDATE run_event SET created_at = (SELECT created_at FROM run_event "
     "WHERE run_id = :r AND seq = 1) WHERE run_id = :r AND seq = 2", 2),
    ("UPDATE run_event SET hash = (SELECT hash FROM run_event WHERE run_id = :r AND seq = 1) "
     "WHERE run_id = :r AND seq = 2", 2),
])
def test_an_edited_event_is_named(unguarded, ledger, sql, seq):
    victim = ledger[1]
    tamper(unguarded, sql, r=victim, d='{"text": "a forged answer"}')
    assert problems(unguarded) == [(victim, seq)]
    assert problems(unguarded, ledger[0]) == []
    assert problems(unguarded, victim) == [(victim, seq)]


def test_an_edited_event_data_is_named_with_the_reason(unguarded, ledger):
    victim = ledger[2]
    tamper(unguarded, "UPDATE run_event SET data = :d WHERE run_id = :r AND seq = 3",
           r=victim, d='{"text": "answer c "}')
    with unguarded.read(transaction=True) as s:
        report = verify_chains(s)
    assert report.problems == [
        ChainProblem(victim, 3, "stored hash does not match the event's content")
    ]


@pytest.mark.parametrize("per_statement", [500, 1])
def test_an_edited_answer_is_named_at_its_runs_ending(unguarded, ledger, monkeypatch,
                                                      per_statement):
    """The answer's text lives in its message row; run.completed's content_sha256 binds it.
    With one answer per look-up, the look-ups run while the events are still streaming."""
    monkeypatch.setattr(chain_verification, "CHOSEN_PER_STATEMENT", per_statement)
    victim = ledger[1]
    tamper(unguarded, "UPDATE message SET content = 'a forged answer' "
                      "WHERE run_id = :r AND role = 'assistant'", r=victim)
    with unguarded.read(transaction=True) as s:
        report = verify_chains(s)
    assert len(report.problems) == 1, report.problems
    (problem,) = report.problems
    assert (problem.run_id, problem.seq) == (victim, 5)
    assert "text is not the text its run recorded" in problem.problem
    assert problems(unguarded, victim) == [(victim, 5)]
    assert problems(unguarded, ledger[0]) == []


@pytest.mark.parametrize("seq", [1, 3, 5])
def test_a_deleted_event_is_named(unguarded, ledger, seq):
    victim = ledger[1]
    tamper(unguarded, "DELETE FROM run_event WHERE run_id = :r AND seq = :s", r=victim, s=seq)
    assert problems(unguarded) == [(victim, seq)]


def test_swapped_seqs_are_named(unguarded, ledger):
    victim = ledger[1]
    for old, new in ((2, -1), (3, 2), (-1, 3)):
        tamper(unguarded, "UPDATE run_event SET seq = :new WHERE run_id = :r AND seq = :old",
               r=victim, old=old, new=new)
    assert problems(unguarded) == [(victim, 2)]


def test_several_damaged_runs_are_each_named_once(unguarded, ledger):
    tamper(unguarded, "DELETE FROM run_event WHERE run_id = :r AND seq = 2", r=ledger[0])
    tamper(unguarded, "UPDATE run_event SET data = '{}' WHERE run_id = :r AND seq >= 3",
           r=ledger[2])
    assert problems(unguarded) == sorted([(ledger[0], 2), (ledger[2], 3)])


@pytest.mark.parametrize("per_statement", [500, 1])
def test_a_chosen_set_of_runs_is_checked_together(unguarded, ledger, monkeypatch, per_statement):
    monkeypatch.setattr(chain_verification, "CHOSEN_PER_STATEMENT", per_statement)
    tamper(unguarded, "DELETE FROM run_event WHERE run_id = :r AND seq = 2", r=ledger[0])
    tamper(unguarded, "UPDATE run_event SET data = '{}' WHERE run_id = :r AND seq >= 3",
           r=ledger[2])
    assert problems(unguarded, run_ids=reversed(ledger)) == sorted([(ledger[0], 2), (ledger[2], 3)])
    assert problems(unguarded, run_ids=[ledger[2], ledger[1]]) == [(ledger[2], 3)]
    assert problems(unguarded, run_ids=[ledger[1]]) == []
    with unguarded.read() as s:
        report = verify_chains(s, run_ids=[ledger[1], ledger[0], "run_missing"])
        assert (report.runs_checked, report.events_checked) == (2, 9)
        assert verify_chains(s, run_ids=[]).runs_checked == 0
        with pytest.raises(ValueError):
            verify_chains(s, run_id=ledger[0], run_ids=[ledger[1]])


def test_cli_verify_exit_codes(unguarded, ledger, db_url):
    clean = cli(db_url, "verify")
    assert clean.returncode == 0, clean.stderr
    assert "OK" in clean.stdout and "3 runs" in clean.stdout and "15 events" in clean.stdout

    victim = ledger[1]
    tamper(unguarded, "UPDATE run_event SET data = '{\"text\": \"forged\"}' "
           "WHERE run_id = :r AND seq = 3", r=victim)
    damaged = cli(db_url, "verify")
    assert damaged.returncode == 1, damaged.stdout + damaged.stderr
    assert f"run {victim} seq 3" in damaged.stdout
    for other in (ledger[0], ledger[2]):
        assert other not in damaged.stdout

    one = cli(db_url, "verify", "--run", ledger[0])
    assert one.returncode == 0, one.stdout
    one = cli(db_url, "verify", "--run", victim)
    assert one.returncode == 1 and f"run {victim} seq 3" in one.stdout


def test_cli_token_create_prints_the_token_last(db, db_url):
    done = cli(db_url, "token", "create", "--owner", "alice", "--role", "admin")
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip().splitlines()[-1]
    assert token.startswith("al_") and len(token) > 30
    with db.read() as s:
        rows = s.execute(select(ApiToken.owner_id, ApiToken.role, ApiToken.token_hash)).all()
    assert [(r.owner_id, r.role) for r in rows] == [("alice", "admin")]
    assert rows[0].token_hash == token_hash(token) != token  # only a hash is stored

    second = cli(db_url, "token", "create", "--owner", "alice", "--role", "admin")
    assert second.stdout.strip().splitlines()[-1] != token
    bad = cli(db_url, "token", "create", "--owner", "alice", "--role", "emperor")
    assert bad.returncode != 0


@pytest.mark.process  # `agentledger db upgrade`, three times per database
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_cli_db_upgrade_creates_the_schema_and_is_idempotent(kind, tmp_path, request):
    if kind == "postgresql":
        request.getfixturevalue("pg_database_url")
    with fresh_database(kind, tmp_path) as url:
        for _ in range(2):
            done = cli(url, "db", "upgrade")
            assert done.returncode == 0, done.stderr
            assert "database at revision" in done.stdout and "None" not in done.stdout
        db = Database(url)
        try:
            make_agent(db, "echo")
            post(db, make_session(db))
        finally:
            db.dispose()
        assert cli(url, "verify").returncode == 0
