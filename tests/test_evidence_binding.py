"""What an evidence bundle binds beyond its chains (docs/evidence.md): event times as the exact
text the hash covers, every run's error and final message against its events, the answer's
session, the order of the runs, and both frozen snapshots through the digests ``run.queued``
records of them (``agent_snapshot_sha256``, ``context_pack_sha256``), which the database-wide
``agentledger verify`` compares too.

Histories are written through ``ingest`` and bundles made by ``queries.evidence`` (no server,
no executor process): fast, on both databases."""

from __future__ import annotations

import copy
import hashlib
import json
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update
from support.factories import make_agent, make_session, post
from support.triggers import dropped_trigger

from agentledger.cli import main
from agentledger.core.hashing import GENESIS_HASH, canonical_json, event_hash, snapshot_sha256
from agentledger.core.schema import AgentRun, AgentVersion, RunEvent
from ingest.events import append_events
from ingest.leases import claim_run
from ingest.runs import ContextItem, create_child_run, snapshot_of
from queries.chain_verification import verify_chains
from queries.evidence import evidence_bundle


@pytest.fixture
def tree(db):
    """alice's answer from a boss run (agent version 2, two context items) that delegated to
    an echo child which answered too."""
    make_agent(db, "boss", versions=2)
    make_agent(db, "echo")
    chat = make_session(db, agent_id="boss")
    posted = post(db, chat, "the task", context=[ContextItem("policy", "Policy", "be precise", 2),
                                                 ContextItem("style", "Style", "be brief", 1)])
    root = posted.run_id
    with db.write() as s:
        claim_run(s, root, "w", lease_seconds=600)
        child = create_child_run(s, root, agent_id="echo", input="part a",
                                 executor_instance_id="w")
        claim_run(s, child, "w", lease_seconds=600)
        append_events(s, child, [("message.delta", {"text": "sub answer"}),
                                 ("run.completed", {})], executor_instance_id="w")
        append_events(s, root, [("message.delta", {"text": "done"}), ("run.completed", {})],
                      executor_instance_id="w")
    with db.read() as s:
        finals = dict(s.execute(select(AgentRun.id, AgentRun.final_message_id)).tuples().all())
    return {"db": db, "chat": chat, "root": root, "child": child, "answer": finals[root],
            "child_answer": finals[child]}


def _bundle(tree, message_id=None) -> dict:
    with tree["db"].read() as s:
        doc = evidence_bundle(s, message_id or tree["answer"])
    return json.loads(json.dumps(doc))  # as a file holds it


def _record(doc, run_id) -> dict:
    return next(r for r in doc["runs"] if r["run"]["id"] == run_id)


def _verify(tmp_path, capsys, doc) -> tuple[int, str]:
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(doc))
    code = main(["verify", "--bundle", str(path)])
    return code, capsys.readouterr().out


def _rechain(doc, record) -> None:
    """Recompute a run's chain, heads included, as the ledger would have stored it."""
    chain = GENESIS_HASH
    for event in record["events"]:
        event["previous_hash"] = chain
        chain = event["hash"] = event_hash(chain, record["run"]["id"], event["seq"],
                                           event["type"], event["data"],
                                           datetime.fromisoformat(event["created_at"]))
    record["run"]["last_event_hash"] = chain
    doc["heads"][record["run"]["id"]]["last_event_hash"] = chain


def test_every_queued_run_records_the_digests_of_its_snapshots(tree, tmp_path, capsys):
    doc = _bundle(tree)
    assert [r["run"]["id"] for r in doc["runs"]] == [tree["root"], tree["child"]]
    for record in doc["runs"]:  # the posted run and the delegated child alike
        run, queued = record["run"], record["events"][0]["data"]
        assert queued["agent_snapshot_sha256"] == snapshot_sha256(run["agent_execution_snapshot"])
        assert queued["context_pack_sha256"] == snapshot_sha256(run["context_pack_snapshot"])
        # the canonical JSON of docs/evidence.md, spelt out
        assert queued["context_pack_sha256"] == hashlib.sha256(json.dumps(
            run["context_pack_snapshot"], sort_keys=True, separators=(",", ":"),
            ensure_ascii=False).encode()).hexdigest()
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 0 and "NOTE" not in out, out


@pytest.mark.parametrize("rewrite", [
    lambda t: t.replace("Z", "+00:00"),
    lambda t: datetime.fromisoformat(t).astimezone(timezone(timedelta(hours=2))).isoformat(),
    lambda t: t.replace("Z", "1Z"),
], ids=["+00:00 for Z", "the same instant at +02:00", "a 7th fraction digit"])
def test_an_event_time_is_the_exact_text_its_hash_covers(tree, tmp_path, capsys, rewrite):
    doc = _bundle(tree)
    event = _record(doc, tree["child"])["events"][2]
    written = event["created_at"]
    event["created_at"] = rewrite(written)
    assert event["created_at"] != written
    assert datetime.fromisoformat(event["created_at"]).replace(microsecond=0) == \
        datetime.fromisoformat(written).replace(microsecond=0)  # the same moment, spelt otherwise
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1, out
    assert f"TAMPERED run {tree['child']} seq 3: created_at {event['created_at']!r} is not " \
           f"written as the ledger wrote it ({written!r})" in out, out


@pytest.mark.parametrize(("whose", "field", "forged", "found"), [
    ("root", "error", {"code": "x", "message": "y"},
     "the run has error {'code': 'x', 'message': 'y'} but did not end with run.failed"),
    ("child", "error", {"code": "x", "message": "y"}, "did not end with run.failed"),
    ("child", "final_message_id", "msg_forged",
     "the run's final_message_id is not the one run.completed recorded"),
    ("child", "executor_instance_id", "someone-else",
     "executor_instance_id is not the one run.started recorded"),
    ("child", "status", "failed", "ends with run.completed but the run is failed"),
])
def test_every_runs_row_is_bound_not_only_the_answers(tree, tmp_path, capsys, whose, field,
                                                      forged, found):
    doc = _bundle(tree)
    _record(doc, tree[whose])["run"][field] = forged
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and f"TAMPERED run {tree[whose]}" in out and found in out, out


def test_a_childs_answer_has_no_session_and_its_message_cannot_claim_one(tree, tmp_path, capsys):
    doc = _bundle(tree, tree["child_answer"])
    assert doc["session"] is None and doc["message"]["session_id"] is None
    assert _verify(tmp_path, capsys, doc)[0] == 0
    doc["message"]["session_id"] = tree["chat"]
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1, out
    assert (f"TAMPERED run {tree['child']}: the answer's session_id {tree['chat']!r} is not "
            "the run's None") in out, out


def test_the_answers_time_is_its_run_completed(tree, tmp_path, capsys):
    doc = _bundle(tree)
    doc["message"]["created_at"] = "2001-01-01T00:00:00+00:00"
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and "the answer's created_at '2001-01-01T00:00:00+00:00' is not the time " \
                         "of its run.completed" in out, out


def test_runs_are_listed_parents_first(tree, tmp_path, capsys):
    doc = _bundle(tree)
    doc["runs"].reverse()
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1, out
    assert f"TAMPERED bundle: the first run is {tree['child']}, not the root {tree['root']}" in out
    assert f"TAMPERED run {tree['child']}: listed before its parent {tree['root']}" in out, out


def test_a_context_item_removed_with_its_pack_hash_recomputed_is_detected(tree, tmp_path, capsys):
    doc = _bundle(tree)
    for record in doc["runs"]:  # consistently, in the child's inherited pack too
        pack = record["run"]["context_pack_snapshot"]
        pack["items"] = [i for i in pack["items"] if i["id"] != "style"]
        pack["pack_hash"] = hashlib.sha256(canonical_json(pack["items"]).encode()).hexdigest()
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1, out
    for run_id in (tree["root"], tree["child"]):
        assert (f"TAMPERED run {run_id} seq 1: the run's context_pack_snapshot is not the "
                "snapshot its run.queued recorded (context_pack_sha256)") in out, out
    assert "pack_hash does not match" not in out  # a valid pack: only the digest tells


def _other_valid_snapshot(tree) -> dict:
    """The snapshot of boss version 1: valid in itself (its content_hash matches)."""
    with tree["db"].read() as s:
        row = s.execute(select(AgentVersion).where(AgentVersion.agent_id == "boss",
                                                   AgentVersion.version == 1)).scalar_one()
        return json.loads(json.dumps(snapshot_of(row)))


def test_an_agent_snapshot_swapped_for_another_valid_one_is_detected(tree, tmp_path, capsys):
    doc = _bundle(tree)
    root = _record(doc, tree["root"])["run"]
    assert root["agent_version"] == 2
    root["agent_execution_snapshot"], root["agent_version"] = _other_valid_snapshot(tree), 1
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1, out
    assert out.splitlines()[0] == (
        f"TAMPERED run {tree['root']} seq 1: the run's agent_execution_snapshot is not the "
        "snapshot its run.queued recorded (agent_snapshot_sha256)"), out


def test_a_run_queued_before_the_snapshot_digests_verifies_with_a_note(tree, tmp_path, capsys):
    """Recorded before run.queued carried the digests: its chain (recomputed as it was then
    stored) verifies as before, its snapshots against their own content hashes, and the report
    says what is not covered: a swap for another valid snapshot goes unseen there."""
    doc = _bundle(tree)
    record = _record(doc, tree["root"])
    for key in ("agent_snapshot_sha256", "context_pack_sha256"):
        del record["events"][0]["data"][key]
    _rechain(doc, record)
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 0, out
    assert ("NOTE the snapshots of 1 run(s) are not covered by the chain: recorded before "
            "run.queued carried agent_snapshot_sha256 and context_pack_sha256") in out, out
    record["run"]["agent_execution_snapshot"] = _other_valid_snapshot(tree)
    record["run"]["agent_version"] = 1
    assert _verify(tmp_path, capsys, doc)[0] == 0
    record["run"]["agent_execution_snapshot"]["instructions"] = "be sloppy"
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and "agent_execution_snapshot: content_hash does not match" in out, out


@pytest.fixture
def unfrozen(tree):
    """The trigger that freezes run snapshots dropped (someone with database access can)."""
    with dropped_trigger(tree["db"], "agent_run_snapshots_frozen", "agent_run"):
        yield tree


@pytest.mark.parametrize("column", ["agent_execution_snapshot", "context_pack_snapshot"])
def test_the_database_verify_binds_each_runs_snapshots(unfrozen, column):
    db = unfrozen["db"]
    with db.read(transaction=True) as s:
        assert verify_chains(s).ok
    with db.read() as s:
        run = s.execute(select(AgentRun).where(AgentRun.id == unfrozen["child"])).scalar_one()
        snapshot = copy.deepcopy(getattr(run, column))
    if column == "agent_execution_snapshot":
        snapshot["instructions"] = "be sloppy"
    else:
        snapshot["items"] = snapshot["items"][:1]
        snapshot["pack_hash"] = hashlib.sha256(
            canonical_json(snapshot["items"]).encode()).hexdigest()
    with db.write() as s:
        s.execute(update(AgentRun).where(AgentRun.id == unfrozen["child"])
                  .values({column: snapshot}))
    with db.read(transaction=True) as s:
        report = verify_chains(s)
    assert [(p.run_id, p.seq, p.problem) for p in report.problems] == [
        (unfrozen["child"], 1, f"the run's {column} is not the snapshot its run.queued recorded")]
    with db.read() as s:  # and one chosen run, as verify --run reads it
        report = verify_chains(s, run_id=unfrozen["child"])
    assert len(report.problems) == 1


def test_the_snapshot_digest_survives_the_database_round_trip(db):
    """A snapshot whose JSON a database might give back otherwise (floats, big and small
    numbers, non-ASCII, nesting) reads back with the digest run.queued recorded of it."""
    params = {"temperature": 0.7, "top_p": 1.0, "big": 12345678901234567, "tiny": 1e-07,
              "nested": {"b": [1, 2.5, None, True], "a": "é ✓"}}
    make_agent(db, "odd", params=params)
    posted = post(db, make_session(db, agent_id="odd"), "x",
                  context=[ContextItem("k", "Tïtle", "çontent", "v1.2")])
    with db.read(transaction=True) as s:
        report = verify_chains(s)
        run = s.execute(select(AgentRun.agent_execution_snapshot, AgentRun.context_pack_snapshot)
                        .where(AgentRun.id == posted.run_id)).one()
        queued = s.execute(select(RunEvent.data).where(RunEvent.run_id == posted.run_id,
                                                       RunEvent.seq == 1)).scalar_one()
    assert report.ok, report.problems
    assert run.agent_execution_snapshot["params"] == params
    assert queued["agent_snapshot_sha256"] == snapshot_sha256(run.agent_execution_snapshot)
    assert queued["context_pack_sha256"] == snapshot_sha256(run.context_pack_snapshot)


@pytest.fixture
def editable_events(tree):
    """The trigger that refuses updates of events dropped (someone with database access can)."""
    with dropped_trigger(tree["db"], "run_event_append_only", "run_event",
                         sqlite_names=("run_event_no_update",)):
        yield tree


def test_the_database_verify_says_what_runs_recorded_before_the_digests_cannot_prove(
        editable_events, db_url, capsys, monkeypatch):
    """The root run's chain as a ledger without the digests recorded it (rewritten and chained
    anew): ``verify`` passes it, checking what it can, and says in NOTE lines what its chain
    does not cover, as ``verify --bundle`` and ``--archive`` do."""
    db, root = editable_events["db"], editable_events["root"]
    with db.write() as s:
        stored = s.execute(select(RunEvent.seq, RunEvent.type, RunEvent.data, RunEvent.created_at)
                           .where(RunEvent.run_id == root).order_by(RunEvent.seq)).all()
        chain = GENESIS_HASH
        for seq, type_, data, created_at in stored:
            data = {k: v for k, v in data.items() if k not in (
                "input_sha256", "agent_snapshot_sha256", "context_pack_sha256", "content_sha256")}
            chain = event_hash(chain, root, seq, type_, data, created_at)
            s.execute(update(RunEvent).where(RunEvent.run_id == root, RunEvent.seq == seq)
                      .values(data=data, hash=chain))
        s.execute(update(AgentRun).where(AgentRun.id == root).values(last_event_hash=chain))
    monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", db_url)

    assert main(["verify"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("NOTE")]
    assert notes == [
        "NOTE the answer texts of 1 run(s) are not covered by the chain: recorded before "
        "answers carried content_sha256 (the streamed message.delta texts are)",
        "NOTE the input of 1 run(s) is not covered by the chain: recorded before run.queued "
        "carried input_sha256",
        "NOTE the snapshots of 1 run(s) are not covered by the chain: recorded before "
        "run.queued carried agent_snapshot_sha256 and context_pack_sha256"], notes
    with db.read(transaction=True) as s:  # a run with every digest adds no note
        assert verify_chains(s, run_id=editable_events["child"]).notes == ()


def test_a_child_cut_short_after_its_end_contradicts_its_parents_word(tree, tmp_path, capsys):
    """The parent's hashed ``run.child_finished`` says how the child ended. A child record cut
    back to before its ``run.completed``, its row and head rewritten to match, was a chain that
    verified on its own, and the bundle said OK."""
    doc = _bundle(tree)
    child = _record(doc, tree["child"])
    assert child["events"].pop()["type"] == "run.completed"
    child["run"].update(status="running", finished_at=None, final_message_id=None,
                        last_event_seq=len(child["events"]))
    doc["heads"][tree["child"]]["last_event_seq"] = len(child["events"])
    _rechain(doc, child)
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1, out
    told = next(e for e in _record(doc, tree["root"])["events"]
                if e["type"] == "run.child_finished")
    assert (f"TAMPERED run {tree['root']} seq {told['seq']}: run.child_finished says child run "
            f"{tree['child']} ended succeeded; the bundle holds it running") in out, out


def test_a_malformed_record_is_named_in_words_and_the_other_runs_are_still_checked(
        tree, tmp_path, capsys):
    """One run's record that lacks a field stopped the whole check with Python's words for it
    (``KeyError('last_event_seq')``, ``AttributeError(...)``), 0 runs checked."""
    doc = _bundle(tree)
    del _record(doc, tree["child"])["run"]["last_event_seq"]
    _record(doc, tree["root"])["events"][1]["data"]["executor_instance_id"] = "x"  # tampered
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1, out
    assert (f"TAMPERED run {tree['child']}: malformed record: the field 'last_event_seq' is "
            "missing") in out, out
    assert f"TAMPERED run {tree['root']} seq 2: hash does not match the event" in out, out
    assert "2 runs, 10 events checked" in out, out
    doc = _bundle(tree)
    created = next(e for e in _record(doc, tree["root"])["events"]
                   if e["type"] == "run.child_created")
    created["data"] = "not an object"
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1, out
    assert ("TAMPERED bundle: malformed bundle: a value is not of the type the format has "
            "('str' object has no attribute 'get')") in out, out
    assert "Error(" not in out, out
    del doc["heads"]
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and "TAMPERED bundle: malformed bundle: the field 'heads' is missing" in out
