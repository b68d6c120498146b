"""``agentledger archive``: old finished trees leave the live tables for a verifiable file."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError
from support.factories import make_agent, make_session, post

from agentledger.core.schema import AgentRun, ArchivedRun, RunEvent
from ingest.events import append_events
from ingest.history import replay_at
from ingest.leases import claim_run
from ingest.retention import archivable_roots
from ingest.runs import create_child_run
from queries.chain_verification import verify_chains

OLD = datetime.now(UTC) - timedelta(days=40)


def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env["AGENTLEDGER_DATABASE_URL"] = db_url
    return subprocess.run([sys.executable, "-m", "agentledger.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def _finished_tree(db, session_id: str, *, at: datetime, child_status: str = "succeeded") -> str:
    """A root with one child, both ended at ``at`` (written through ingest with replay_at)."""
    root = post(db, session_id, f"question at {at:%F}").run_id
    with db.write() as s:
        replay_at(s, at)
        claim_run(s, root, "w", lease_seconds=600)
        child = create_child_run(s, root, agent_id="echo", input="sub", executor_instance_id="w")
        claim_run(s, child, "w", lease_seconds=600)
        append_events(s, child, [("message.delta", {"text": "c"}), ("run.completed", {})],
                      executor_instance_id="w")
        append_events(s, root, [("message.delta", {"text": "r"}), ("run.completed", {})],
                      executor_instance_id="w")
    return root


def _counts(db) -> tuple[int, int, int]:
    with db.read() as s:
        return (s.execute(select(func.count()).select_from(AgentRun)).scalar_one(),
                s.execute(select(func.count()).select_from(RunEvent)).scalar_one(),
                s.execute(select(func.count()).select_from(ArchivedRun)).scalar_one())


@pytest.fixture
def history(db):
    make_agent(db, "echo")
    chat = make_session(db)
    old_root = _finished_tree(db, chat, at=OLD)
    recent_root = _finished_tree(db, chat, at=datetime.now(UTC) - timedelta(days=1))
    live_root = post(db, chat, "still queued").run_id
    return chat, old_root, recent_root, live_root


def test_only_old_finished_trees_are_archived_and_both_sides_verify(db, db_url, history, tmp_path):
    chat, old_root, recent_root, live_root = history
    runs_before, events_before, _ = _counts(db)
    done = _cli(db_url, "archive", "--older-than-days", "30", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "archived 1 run tree(s), 2 run(s)" in done.stdout
    # stderr is no terminal here (a log, cron's mail): no bar redrawn with carriage returns;
    # an archive this short ends before its first progress line
    assert done.stderr == ""
    runs_after, events_after, archived = _counts(db)
    assert (runs_before - runs_after, archived) == (2, 2)
    # root: queued, started, child_created, delta, child_finished, completed; child: 4 of them
    assert events_before - events_after == 6 + 4
    with db.read(transaction=True) as s:
        remaining = set(s.execute(select(AgentRun.root_run_id)).scalars())
        assert remaining == {recent_root, live_root}
        assert verify_chains(s).ok
    (archive,) = tmp_path.glob("*.jsonl.gz")
    checked = _cli(db_url, "verify", "--archive", str(archive))
    assert checked.returncode == 0 and "OK: 2 archived runs" in checked.stdout
    assert _cli(db_url, "verify").returncode == 0


def test_a_tampered_archive_is_named_by_run_and_seq(db, db_url, history, tmp_path):
    _chat, old_root, _recent, _live = history
    assert _cli(db_url, "archive", "--older-than-days", "30", "--out", str(tmp_path)).returncode == 0
    (archive,) = tmp_path.glob("*.jsonl.gz")
    records = [json.loads(line) for line in gzip.open(archive, "rt")]
    target = next(r for r in records if r["run"]["id"] == old_root)
    target["events"][2]["data"]["text"] = "rewritten"
    with gzip.open(archive, "wt") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    checked = _cli(db_url, "verify", "--archive", str(archive))
    assert checked.returncode == 1
    assert f"TAMPERED run {old_root} seq 3" in checked.stdout


def test_trees_with_an_unfinished_run_stay(db, history):
    _chat, old_root, _recent, _live = history
    root = post(db, make_session(db), "old but its child still runs").run_id
    with db.write() as s:
        replay_at(s, OLD)
        claim_run(s, root, "w", lease_seconds=600)
        create_child_run(s, root, agent_id="echo", input="sub", executor_instance_id="w")
        append_events(s, root, [("run.failed", {"error": {"code": "x", "message": "y"}})],
                      executor_instance_id="w")
    with db.read() as s:
        roots = archivable_roots(s, finished_before=datetime.now(UTC) - timedelta(days=30),
                                 limit=None)
    assert roots == [old_root]


def test_events_of_live_runs_still_cannot_be_deleted(db, db_url, history, tmp_path):
    _chat, _old, recent_root, _live = history
    assert _cli(db_url, "archive", "--older-than-days", "30", "--out", str(tmp_path)).returncode == 0
    with pytest.raises(DBAPIError):
        with db.engine.begin() as conn:
            conn.execute(text("DELETE FROM run_event WHERE run_id = :r"), {"r": recent_root})
    with pytest.raises(DBAPIError):
        with db.engine.begin() as conn:
            conn.execute(text("UPDATE run_event SET type = 'x' WHERE run_id = :r"),
                         {"r": recent_root})


def test_dry_run_changes_nothing(db, db_url, history, tmp_path):
    before = _counts(db)
    done = _cli(db_url, "archive", "--older-than-days", "30", "--out", str(tmp_path), "--dry-run")
    assert done.returncode == 0 and "1 run tree(s)" in done.stdout
    assert _counts(db) == before
    assert not list(Path(tmp_path).glob("*.gz"))


def test_two_archive_runs_at_once_share_the_trees_each_in_a_file_of_its_own(db, db_url,
                                                                            tmp_path):
    # (on PostgreSQL both exported the same trees: one reported trees it had not archived and
    # left an empty file; in one directory in the same second both appended to one file)
    from agentledger.core.archive_format import read_archive

    make_agent(db, "echo")
    chat = make_session(db)
    roots = [_finished_tree(db, chat, at=OLD + timedelta(minutes=n)) for n in range(40)]
    with db.read() as s:
        expected = sorted(s.execute(select(AgentRun.id)).scalars())
    assert len(expected) == 2 * len(roots)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env["AGENTLEDGER_DATABASE_URL"] = db_url
    command = [sys.executable, "-m", "agentledger.cli", "archive", "--older-than-days", "30",
               "--out", str(out), "--batch-size", "2"]
    both = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    said = [p.communicate(timeout=120) for p in both]
    assert [p.returncode for p in both] == [0, 0], said
    files = sorted(out.glob("*.jsonl.gz"))
    archived = {f: [record["run"]["id"] for record in read_archive(f)] for f in files}
    assert sorted(i for ids in archived.values() for i in ids) == expected  # each run once
    assert all(archived.values()), archived  # no empty file
    # each says what it archived, into its own file
    told = sorted(line for stdout, _ in said for line in stdout.splitlines()
                  if line.startswith("archived"))
    assert told == sorted(f"archived {len(ids) // 2} run tree(s), {len(ids)} run(s) into {f}"
                          for f, ids in archived.items()), (told, said)
    assert _counts(db)[0] == 0
    for f in files:
        checked = _cli(db_url, "verify", "--archive", str(f))
        assert checked.returncode == 0, checked.stdout + checked.stderr
