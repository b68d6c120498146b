"""``agentledger verify --archive``: a real archive file checked as strictly as an evidence
bundle (the same per-run rules), each run once and each tree whole, and, against the database
that wrote it, for every run archived into it; offline when no database is named. And
``agentledger archive`` refusing an unusable ``--out`` before anything is deleted."""

from __future__ import annotations

import copy
import errno
import gzip
import json
import re
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from support.factories import make_agent, make_session, post

from agentledger.archive import verify_archive_command
from agentledger.cli import main
from agentledger.core import progress
from agentledger.core.config import Settings
from agentledger.core.hashing import GENESIS_HASH, event_hash
from agentledger.core.schema import AgentRun, ArchivedRun
from ingest.events import append_events
from ingest.history import replay_at
from ingest.leases import claim_run
from ingest.runs import ContextItem, create_child_run

OLD = datetime.now(UTC) - timedelta(days=40)


def _old_tree(db, chat: str, question: str, *, children: int) -> str:
    """A root (with context) that delegated to ``children`` echo runs; all ended 40 days ago."""
    root = post(db, chat, question, context=[ContextItem("kb", "KB", "the facts", 1)]).run_id
    with db.write() as s:
        replay_at(s, OLD)
        claim_run(s, root, "w", lease_seconds=600)
        for n in range(children):
            child = create_child_run(s, root, agent_id="echo", input=f"part {n}",
                                     executor_instance_id="w")
            claim_run(s, child, "w", lease_seconds=600)
            append_events(s, child, [("message.delta", {"text": f"c{n}"}), ("run.completed", {})],
                          executor_instance_id="w")
        append_events(s, root, [("message.delta", {"text": "r"}), ("run.completed", {})],
                      executor_instance_id="w")
    return root


@pytest.fixture
def archived(db, db_url, tmp_path, monkeypatch, capsys):
    """Three old trees (the first with two children, the others with one and none) archived
    into one file by ``agentledger archive``; its records as written."""
    make_agent(db, "echo")
    chat = make_session(db)
    roots = [_old_tree(db, chat, "first", children=2), _old_tree(db, chat, "second", children=1),
             _old_tree(db, chat, "third", children=0)]
    monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", db_url)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(progress, "LINE_EVERY_SECONDS", 0.0)  # a progress line at each batch
    assert main(["archive", "--older-than-days", "30", "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert "archived 3 run tree(s), 6 run(s)" in out
    assert "archive: 3 of 3 trees (100%) done in" in err  # the progress knows its total
    (path,) = (tmp_path / "out").glob("*.jsonl.gz")
    records = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
    assert [r["run"]["root_run_id"] for r in records] == [roots[0]] * 3 + [roots[1]] * 2 + [roots[2]]
    return {"db": db, "url": db_url, "path": path, "records": records, "roots": roots}


def _write(path: Path, records: list[dict]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n")


def _verify(archived, monkeypatch, capsys, records=None, *, with_db: bool,
            path: Path | None = None) -> tuple[int, str]:
    path = path or archived["path"]
    if records is not None:
        _write(path, records)
    if with_db:
        monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", archived["url"])
    else:
        monkeypatch.delenv("AGENTLEDGER_DATABASE_URL", raising=False)
    code = main(["verify", "--archive", str(path)])
    return code, capsys.readouterr().out


def _run(records, run_id) -> dict:
    return next(r for r in records if r["run"]["id"] == run_id)


def _rechain(record) -> None:
    chain = GENESIS_HASH
    for event in record["events"]:
        chain = event["hash"] = event_hash(chain, record["run"]["id"], event["seq"],
                                           event["type"], event["data"],
                                           datetime.fromisoformat(event["created_at"]))
    record["run"]["last_event_hash"] = chain


def test_a_real_archive_verifies_with_the_database_and_offline(archived, monkeypatch, capsys,
                                                               tmp_path):
    code, out = _verify(archived, monkeypatch, capsys, with_db=True)
    assert code == 0, out
    events = sum(len(r["events"]) for r in archived["records"])
    assert out.splitlines()[-1] == (f"OK: 6 archived runs, {events} events checked in "
                                    f"{archived['path']}")
    assert "not consulted" not in out
    # Offline: nothing but the file (no database URL; no agentledger.db is made in the cwd).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out = _verify(archived, monkeypatch, capsys, with_db=False)
    assert code == 0, out
    assert ("NOTE the database was not consulted (AGENTLEDGER_DATABASE_URL is not set): not "
            "checked that the file holds every run archived into it") in out, out
    assert out.splitlines()[-1].startswith("OK: 6 archived runs")
    assert list(elsewhere.iterdir()) == []


def _drop(run_key):
    def tamper(a, records):
        run_id = run_key(a)
        return [r for r in records if r["run"]["id"] != run_id], run_id
    return tamper


def _child(a, n=0):
    return [r for r in a["records"] if r["run"]["parent_run_id"] == a["roots"][0]][n]["run"]["id"]


def _edit(run_key, change):
    def tamper(a, records):
        run_id = run_key(a)
        change(_run(records, run_id))
        return records, run_id
    return tamper


def _answer(record):
    return next(m for m in record["messages"] if m["role"] == "assistant")


def _question(record):
    return next(m for m in record["messages"] if m["role"] == "user")


def _duplicate(a, records):
    return records + [copy.deepcopy(records[1])], records[1]["run"]["id"]


def _respell_time(record):
    event = record["events"][1]
    event["created_at"] = event["created_at"].replace("+00:00", "Z")


ROOT = lambda a: a["roots"][0]  # noqa: E731

TAMPERING = {  # name: (tamper, what verify names)
    "a child's record removed": (lambda a, r: (_drop(_child)(a, r)[0], a["roots"][0]),
                                 "is not in the file"),
    "a root's record removed": (lambda a, r: (_drop(ROOT)(a, r)[0], _child(a)),
                                "is not in the file"),
    "a record repeated": (_duplicate, "record 7 holds this run again"),
    "the answer's text": (_edit(ROOT, lambda r: _answer(r).update(content="forged")),
                          "the answer's text is not the text its run recorded"),
    "run.input": (_edit(ROOT, lambda r: r["run"].update(input="forged")),
                  "the run's input is not the text its run.queued recorded"),
    "the question's text": (_edit(ROOT, lambda r: _question(r).update(content="forged")),
                            "is not the run's question"),
    "run.status": (_edit(ROOT, lambda r: r["run"].update(status="failed")),
                   "ends with run.completed but the run is failed"),
    "run.agent_id": (_edit(ROOT, lambda r: r["run"].update(agent_id="other")),
                     "run.queued records agent_id 'echo', the run 'other'"),
    "the snapshot's instructions": (
        _edit(ROOT, lambda r: r["run"]["agent_execution_snapshot"].update(instructions="evil")),
        "the run's agent_execution_snapshot is not the snapshot its run.queued recorded"),
    "the pack": (_edit(ROOT, lambda r: r["run"]["context_pack_snapshot"]["items"][0].update(
        title="forged")), "pack_hash does not match its items"),
    "an error on a succeeded run": (
        _edit(_child, lambda r: r["run"].update(error={"code": "x", "message": "y"})),
        "but did not end with run.failed"),
    "an event's time respelt": (_edit(ROOT, _respell_time), "is not written as the ledger"),
    "a child's tree split off": (
        lambda a, r: ([x for x in r if x["run"]["id"] != _child(a)] + [_run(r, _child(a))],
                      _child(a)), "apart from the others"),
}


@pytest.mark.parametrize("with_db", [True, False], ids=["with the database", "offline"])
@pytest.mark.parametrize("case", TAMPERING)
def test_tampering_with_a_record_is_named_with_and_without_the_database(
        archived, monkeypatch, capsys, case, with_db):
    tamper, found = TAMPERING[case]
    records, run_id = tamper(archived, copy.deepcopy(archived["records"]))
    code, out = _verify(archived, monkeypatch, capsys, records, with_db=with_db)
    assert code == 1, out
    assert f"TAMPERED run {run_id}" in out and found in out, out


@pytest.mark.parametrize("cut", ["a whole tree removed", "the file cut short between trees"])
def test_records_missing_whole_are_found_against_the_database_only(archived, monkeypatch,
                                                                   capsys, cut):
    records = copy.deepcopy(archived["records"])
    if cut == "a whole tree removed":
        gone = archived["roots"][1]
        kept = [r for r in records if r["run"]["root_run_id"] != gone]
    else:
        kept = records[:3]  # only the first tree
    missing = [r["run"]["id"] for r in records if r not in kept]
    code, out = _verify(archived, monkeypatch, capsys, kept, with_db=True)
    assert code == 1, out
    for run_id in missing:
        assert (f"TAMPERED run {run_id}: missing: the database recorded it as archived into "
                "this file") in out, out
    assert out.splitlines()[-1].startswith(f"{len(missing)} problem(s) in {len(missing)} run(s):")
    # Offline, the rest of the file is consistent: it verifies, and says what it could not check.
    code, out = _verify(archived, monkeypatch, capsys, kept, with_db=False)
    assert code == 0 and "a run tree removed whole, or the file cut short between two trees, " \
                         "goes unseen without it" in out, out


def test_a_run_rewritten_consistently_differs_from_what_was_archived(archived, monkeypatch,
                                                                     capsys):
    """A self-consistent rewrite (the hashes recomputed) passes the file's own checks; the head
    the database recorded when it archived the run does not match."""
    records = copy.deepcopy(archived["records"])
    victim = _run(records, archived["roots"][2])
    delta = next(e for e in victim["events"] if e["type"] == "message.delta")
    delta["data"]["text"] = "rewritten"
    _rechain(victim)
    code, out = _verify(archived, monkeypatch, capsys, records, with_db=False)
    assert code == 0, out
    code, out = _verify(archived, monkeypatch, capsys, records, with_db=True)
    assert code == 1, out
    assert f"TAMPERED run {archived['roots'][2]}: the run differs from what was archived" in out


def test_the_verdict_counts_problems_and_runs(archived, monkeypatch, capsys):
    records = copy.deepcopy(archived["records"])
    root = _run(records, archived["roots"][0])
    root["run"]["input"] = "forged"
    root["run"]["error"] = {"code": "x", "message": "y"}
    code, out = _verify(archived, monkeypatch, capsys, records, with_db=False)
    assert code == 1
    problems = [line for line in out.splitlines() if line.startswith("TAMPERED")]
    assert len(problems) == 3, out  # the input, its question message, the error
    assert out.splitlines()[-1].startswith("3 problem(s) in 1 run(s): 6 archived runs")


def test_a_renamed_file_is_checked_against_what_was_archived_under_its_old_name(
        archived, monkeypatch, capsys, tmp_path):
    moved = tmp_path / "cold-storage.jsonl.gz"
    shutil.copy(archived["path"], moved)
    code, out = _verify(archived, monkeypatch, capsys, with_db=True, path=moved)
    assert code == 0, out
    assert f"NOTE the database recorded this file as {archived['path']} (renamed since)" in out
    code, out = _verify(archived, monkeypatch, capsys, archived["records"][:3], with_db=True,
                        path=moved)
    assert code == 1 and out.count("missing: the database recorded it") == 3, out


def test_a_database_that_archived_nothing_checks_the_file_alone(archived, tmp_path, capsys):
    empty = tmp_path / "empty.db"
    shutil.copy(archived["path"], tmp_path / "copy.jsonl.gz")
    from agentledger.core.migrate import upgrade

    upgrade(f"sqlite:///{empty}")
    code = verify_archive_command(Settings(database_url=f"sqlite:///{empty}"),
                                  str(tmp_path / "copy.jsonl.gz"), use_database=True)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "has archived nothing: not checked that the file holds every run" in out, out


def test_a_file_the_database_did_not_archive_is_refused(archived, monkeypatch, capsys,
                                                       tmp_path):
    """Another ledger's archive (its own name, runs this database never archived)."""
    records = copy.deepcopy(archived["records"])
    for record in records:
        record["run"]["id"] = record["run"]["id"].replace("run_", "run_x")
    other = tmp_path / "agentledger-archive-20200101T000000Z.jsonl.gz"
    code, out = _verify(archived, monkeypatch, capsys, records, with_db=True, path=other)
    assert code == 1
    assert "the database archived none of the file's 6 run(s) (is it the ledger that wrote " \
           "this file?)" in out, out
    assert "missing" not in out and "has no record of archiving" not in out


# ---- agentledger archive --out ---------------------------------------------------------------


def _live_runs(db) -> int:
    with db.read() as s:
        return s.execute(select(func.count()).select_from(AgentRun)).scalar_one()


@pytest.fixture
def old_history(db, db_url, monkeypatch, tmp_path):
    make_agent(db, "echo")
    _old_tree(db, make_session(db), "old", children=1)
    monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", db_url)
    monkeypatch.chdir(tmp_path)
    return db


@pytest.mark.parametrize("out", ["an existing file", "under a file", "/proc/nope/x"])
def test_an_unusable_out_is_one_line_before_anything_is_deleted(old_history, tmp_path, capsys,
                                                                out):
    existing = tmp_path / "hostname"
    existing.write_text("x")
    target, reason = {
        "an existing file": (str(existing), "it exists and is not a directory"),
        "under a file": (str(existing / "sub"), "not a directory"),
        "/proc/nope/x": ("/proc/nope/x", "no such file or directory"),
    }[out]
    if out == "/proc/nope/x" and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    assert main(["archive", "--older-than-days", "30", "--out", target]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"agentledger: cannot write archives into {target}: {reason}\n"
    assert captured.out == ""
    assert _live_runs(old_history) == 2
    with old_history.read() as s:
        assert s.execute(select(func.count()).select_from(ArchivedRun)).scalar_one() == 0


def test_a_file_that_cannot_be_written_deletes_nothing(old_history, tmp_path, capsys,
                                                       monkeypatch):
    from agentledger.core import archive_format

    def full(self, records):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(archive_format.ArchiveWriter, "write", full)
    assert main(["archive", "--older-than-days", "30", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("agentledger: cannot write archive file ")
    assert err.endswith(": no space left on device (nothing was archived)")
    assert _live_runs(old_history) == 2


def test_an_archived_run_tells_viewers_and_admins_where_it_went(archived):
    """A run that left the live tables is still 404 (its rows are gone), but a viewer or admin
    asking for it learns when it was archived and into which file (its name, not the server's
    directory); a user gets the plain 404, as for any run that does not exist."""
    from support.api import FlaskHttp, make_tokens
    from support.dashboards import call, logged_in, make_app, texts

    db, name = archived["db"], archived["path"].name
    root = archived["roots"][0]
    child = next(r["run"]["id"] for r in archived["records"]
                 if r["run"]["root_run_id"] == root and r["run"]["id"] != root)
    app = make_app(db)
    try:
        http = FlaskHttp(app.test_client())
        tokens = make_tokens(db, {"admin": ("root", "admin"), "viewer": ("auditor", "viewer"),
                                  "alice": ("alice", "user"), "bob": ("bob", "user")})
        for role in ("admin", "viewer"):
            for path in (f"/api/agent-runs/{root}", f"/api/agent-runs/{root}/events",
                         f"/api/agent-runs/{root}/tree"):
                reply = http.request("GET", path, token=tokens[role])
                assert reply.status == 404, (path, reply)
                error = reply.json()["error"]
                assert error["code"] == "not_found"
                assert re.fullmatch(rf"run {root} was archived on \d{{4}}-\d\d-\d\d \d\d:\d\d UTC "
                                    rf"into {re.escape(name)}; `agentledger verify --archive` "
                                    "checks that file", error["message"]), error
                assert str(archived["path"].parent) not in error["message"]
            stream = http.request("GET", f"/api/agent-runs/{root}/events", token=tokens[role],
                                  headers={"Accept": "text/event-stream"})
            assert stream.status == 404 and "was archived on" in stream.json()["error"]["message"]
            of_child = http.request("GET", f"/api/agent-runs/{child}",
                                    token=tokens[role]).json()["error"]["message"]
            assert f"run {child} was archived on " in of_child
            assert f"with its tree (root {root}) into {name}" in of_child
        for role in ("alice", "bob"):  # alice owned it: still no word of the archive
            reply = http.request("GET", f"/api/agent-runs/{root}", token=tokens[role])
            assert reply.status == 404
            assert reply.json()["error"]["message"] == f"run {root} does not exist"
        never = http.request("GET", "/api/agent-runs/run_never", token=tokens["admin"])
        assert never.json()["error"]["message"] == "run run_never does not exist"

        page = logged_in(app, tokens["viewer"])
        shown = call(page, [("run-header", "children"), ("run-tree", "elements"),
                            ("run-tree", "layout")],
                     [("run-id", "data", child)], changed=["run-id.data"])
        header = " ".join(texts(shown["run-header"]["children"]))
        assert "Archived run" in header and f"Run {child} was archived on " in header
        assert name in header and shown["run-tree"]["elements"] == []
    finally:
        app.extensions["agentledger"].close()
