"""Evidence bundles (CONTRACT §9): ``GET /api/messages/{id}/evidence`` of a real delegated run,
who may download it, and ``agentledger verify --bundle`` detecting every kind of tampering and
naming the run and seq (or the snapshot) that does not verify."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from datetime import datetime

import pytest
from support.dashboards import csrf_headers, dash_request, logged_in, make_app
from support.factories import make_agent, make_session, post
from support.processes import ExecutorPool, wait_for_status

from agentledger.cli import main
from agentledger.core.evidence_format import verify_bundle
from agentledger.core.hashing import GENESIS_HASH, event_hash
from queries.runs import get_run


@pytest.fixture
def answered(db, api):
    """A succeeded run of alice's that delegated to two children, one of them with a tool call."""
    make_agent(db, "helper", kind="scripted", params={"steps": [
        {"say": "helped with {input}"},
        {"tool": "search", "input": {"q": "x"}, "output": {"hits": 1}}]})
    make_agent(db, "boss", kind="scripted", params={"steps": [
        {"say": "delegating. "},
        {"delegate": [{"agent_id": "helper", "input": "part a"},
                      {"agent_id": "echo", "input": "part b"}]},
        {"say": "done"}]})
    from ingest.runs import ContextItem

    posted = post(db, make_session(db, agent_id="boss"), "the task",
                  context=[ContextItem("policy", "Policy", "be precise", 2)])
    with ExecutorPool(db) as pool:
        pool.start("evidence-exec")
        wait_for_status(db, posted.run_id, "succeeded", timeout=20)
    with db.read() as s:
        run = get_run(s, posted.run_id)
    return {"run_id": posted.run_id, "user_message_id": posted.message_id,
            "message_id": run["final_message_id"]}


def _bundle(api, answered, token=None):
    reply = api.get(f"/api/messages/{answered['message_id']}/evidence", token or api.alice)
    assert reply.status == 200, reply
    return reply.json()


def _verify(tmp_path, capsys, doc) -> tuple[int, str]:
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(doc))
    code = main(["verify", "--bundle", str(path)])
    return code, capsys.readouterr().out


def test_a_real_bundle_holds_the_whole_tree_and_verifies_offline(api, answered, tmp_path):
    reply = api.get(f"/api/messages/{answered['message_id']}/evidence", api.alice)
    assert reply.status == 200
    assert reply.headers["Content-Disposition"] == (
        f'attachment; filename="evidence-{answered["message_id"]}.json"')
    assert reply.headers["Content-Type"].startswith("application/json")
    doc = reply.json()
    assert doc["format"] == "agentledger-evidence" and doc["format_version"] == 1
    assert doc["message"]["id"] == answered["message_id"]
    assert doc["message"]["content"] == "delegating. done"
    assert doc["session"]["owner_id"] == "alice" and doc["session"]["title"] == "a session"
    runs = {r["run"]["id"]: r for r in doc["runs"]}
    assert len(runs) == 3 and doc["runs"][0]["run"]["id"] == answered["run_id"]
    assert {r["run"]["agent_id"] for r in doc["runs"]} == {"boss", "helper", "echo"}
    for record in doc["runs"]:
        run = record["run"]
        assert [e["seq"] for e in record["events"]] == list(range(1, run["last_event_seq"] + 1))
        assert record["events"][0]["previous_hash"] == "0" * 64
        assert all(b["previous_hash"] == a["hash"]
                   for a, b in zip(record["events"], record["events"][1:], strict=False))
        assert doc["heads"][run["id"]] == {"last_event_seq": run["last_event_seq"],
                                           "last_event_hash": run["last_event_hash"]}
        assert run["agent_execution_snapshot"]["content_hash"]
    assert list(doc["context_contents"].values()) == ["be precise"]
    assert doc["agentledger_version"] and doc["generated_at"]
    assert doc["ledger_check"] == {"ok": True, "problems": []}
    assert verify_bundle(doc).ok, verify_bundle(doc).problems

    # The command needs nothing but the file: no database, not even a database URL.
    path = tmp_path / "evidence.json"
    path.write_bytes(reply.body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env["AGENTLEDGER_DATABASE_URL"] = "sqlite:////nonexistent/dir/agentledger.db"
    done = subprocess.run([sys.executable, "-m", "agentledger.cli", "verify", "--bundle", str(path)],
                          capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: 3 runs")


def _child(doc, agent_id):
    return next(r for r in doc["runs"] if r["run"]["agent_id"] == agent_id)


def _change_a_byte(doc):
    record = _child(doc, "helper")
    event = next(e for e in record["events"] if e["type"] == "tool.call")
    event["data"]["input"]["q"] = "y"
    return record["run"]["id"], event["seq"]


def _change_created_at(doc):
    record = _child(doc, "echo")
    event = record["events"][1]
    event["created_at"] = event["created_at"][:-2] + ("1Z" if event["created_at"][-2] != "1" else "2Z")
    return record["run"]["id"], event["seq"]


def _change_type(doc):
    record = doc["runs"][0]
    event = next(e for e in record["events"] if e["type"] == "message.delta")
    event["type"] = "message.deltb"
    return record["run"]["id"], event["seq"]


def _change_stored_hash(doc):
    record = doc["runs"][0]
    event = record["events"][2]
    event["hash"] = ("1" if event["hash"][0] != "1" else "2") + event["hash"][1:]
    return record["run"]["id"], event["seq"]


def _drop_event(doc):
    record = _child(doc, "helper")
    del record["events"][2]
    return record["run"]["id"], 3


def _drop_last_event(doc):
    record = _child(doc, "echo")
    last = record["events"].pop()
    return record["run"]["id"], last["seq"]


def _reorder(doc):
    record = doc["runs"][0]
    record["events"][2], record["events"][3] = record["events"][3], record["events"][2]
    return record["run"]["id"], 3


def _reorder_keeping_seqs(doc):
    record = doc["runs"][0]
    a, b = record["events"][2], record["events"][3]
    for key in ("type", "data"):
        a[key], b[key] = b[key], a[key]
    return record["run"]["id"], 3


@pytest.mark.parametrize("tamper", [
    _change_a_byte, _change_created_at, _change_type, _change_stored_hash, _drop_event,
    _drop_last_event, _reorder, _reorder_keeping_seqs,
], ids=lambda f: f.__name__.strip("_"))
def test_every_event_tampering_is_detected_and_named(api, answered, tmp_path, capsys, tamper):
    doc = _bundle(api, answered)
    run_id, seq = tamper(doc)
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1, out
    assert f"TAMPERED run {run_id} seq {seq}:" in out, out


def test_a_swapped_or_edited_snapshot_is_detected_and_named(api, answered, tmp_path, capsys):
    original = _bundle(api, answered)
    root, helper = original["runs"][0]["run"], _child(original, "helper")["run"]

    doc = copy.deepcopy(original)
    a, b = doc["runs"][0]["run"], _child(doc, "helper")["run"]
    a["agent_execution_snapshot"], b["agent_execution_snapshot"] = (
        b["agent_execution_snapshot"], a["agent_execution_snapshot"])
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1
    assert f"run {root['id']}: agent_execution_snapshot is of agent helper" in out, out
    assert f"run {helper['id']}: agent_execution_snapshot is of agent boss" in out, out

    doc = copy.deepcopy(original)
    doc["runs"][0]["run"]["agent_execution_snapshot"]["instructions"] = "be sloppy"
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and f"run {root['id']}: agent_execution_snapshot: content_hash" in out, out

    doc = copy.deepcopy(original)
    doc["runs"][0]["run"]["context_pack_snapshot"]["items"][0]["version"] = 3
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and f"run {root['id']}: context_pack_snapshot: pack_hash" in out, out

    doc = copy.deepcopy(original)
    (digest,) = doc["context_contents"]
    doc["context_contents"][digest] = "be vague"
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and "context item 'policy': sha256 does not match" in out, out


def test_links_heads_and_the_answer_are_checked(api, answered, tmp_path, capsys):
    original = _bundle(api, answered)
    helper = _child(original, "helper")["run"]["id"]

    doc = copy.deepcopy(original)
    doc["runs"] = [r for r in doc["runs"] if r["run"]["id"] != helper]
    del doc["heads"][helper]
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and f"child run {helper} is not in the bundle" in out, out

    doc = copy.deepcopy(original)
    doc["heads"][helper]["last_event_seq"] += 1
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and f"run {helper} seq" in out and "heads" in out, out

    doc = copy.deepcopy(original)
    doc["message"]["id"] = answered["user_message_id"]
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and "is not the run's final message" in out, out

    doc = copy.deepcopy(original)
    _child(doc, "echo")["run"]["parent_run_id"] = helper
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and "run.queued records parent_run_id" in out, out

    code, out = _verify(tmp_path, capsys, {"not": "a bundle"})
    assert code == 1 and "not an agentledger-evidence document" in out


def test_the_answers_text_is_bound_to_its_run(api, answered, tmp_path, capsys):
    original = _bundle(api, answered)
    root = original["runs"][0]
    completed = root["events"][-1]
    assert completed["type"] == "run.completed"
    assert completed["data"]["content_sha256"] == hashlib.sha256(
        original["message"]["content"].encode()).hexdigest()
    code, out = _verify(tmp_path, capsys, original)
    assert code == 0 and "NOTE" not in out, out

    doc = copy.deepcopy(original)
    doc["message"]["content"] = "evil answer"
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1, out
    assert (f"TAMPERED run {root['run']['id']} seq {completed['seq']}: the answer's text is "
            "not the text its run recorded") in out, out


@pytest.mark.parametrize(("field", "forged", "found"), [
    ("input", "a question nobody asked", "the run's input is not the text its run.queued "
                                         "recorded"),
    ("executor_instance_id", "someone-else", "executor_instance_id is not the one run.started"),
    ("created_at", "2001-01-01T00:00:00.000000Z", "the run's created_at"),
    ("started_at", "2001-01-01T00:00:00.000000Z", "the run's started_at"),
    ("finished_at", None, "the run's finished_at"),
])
def test_the_run_rows_fields_its_events_record_are_bound(api, answered, tmp_path, capsys,
                                                         field, forged, found):
    """The question and the row fields its events also record (times, executor) cannot be
    edited in a bundle: verify names the run."""
    original = _bundle(api, answered)
    root = original["runs"][0]
    assert root["events"][0]["data"]["input_sha256"] == hashlib.sha256(
        root["run"]["input"].encode()).hexdigest()
    for record in original["runs"]:  # every run of the tree, children's tasks included
        assert record["events"][0]["data"]["input_sha256"] == hashlib.sha256(
            record["run"]["input"].encode()).hexdigest()
    doc = copy.deepcopy(original)
    doc["runs"][0]["run"][field] = forged
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 1 and f"run {root['run']['id']}" in out and found in out, out


def test_a_failed_runs_error_is_bound(db, api, tmp_path, capsys):
    make_agent(db, "boom", kind="scripted", params={"steps": [{"say": "x"}, {"fail": "broken"}]})
    posted = post(db, make_session(db, agent_id="boom"), "try")
    with ExecutorPool(db) as pool:
        pool.start("evidence-fail")
        wait_for_status(db, posted.run_id, "failed", timeout=20)
    from agentledger.core.evidence_format import _row_problems

    with db.read() as s:
        run = get_run(s, posted.run_id)
    events = api.get(f"/api/agent-runs/{posted.run_id}/events?limit=500", api.alice).json()
    record = {"id": posted.run_id, "status": "failed", "error": run["error"],
              "created_at": run["created_at"], "started_at": run["started_at"],
              "finished_at": run["finished_at"], "executor_instance_id": "evidence-fail"}
    assert _row_problems(record, events["events"]) == []
    forged = {**record, "error": {"code": "agent_error", "message": "something else"}}
    assert ["run.failed" in p.problem for p in _row_problems(forged, events["events"])] == [True]


def test_the_database_verify_binds_each_runs_input(db, api, answered):
    from sqlalchemy import update

    from agentledger.core.schema import AgentRun
    from queries.chain_verification import verify_chains

    with db.read(transaction=True) as s:
        assert verify_chains(s).ok
    with db.write() as s:
        s.execute(update(AgentRun).where(AgentRun.id == answered["run_id"])
                  .values(input="a question nobody asked"))
    with db.read(transaction=True) as s:
        report = verify_chains(s)
    assert [(p.run_id, p.seq, p.problem) for p in report.problems] == [
        (answered["run_id"], 1, "the run's input is not the text its run.queued recorded")]


def test_an_answer_recorded_before_its_digest_verifies_with_a_note(api, answered, tmp_path,
                                                                     capsys):
    """A run.completed written before answers carried content_sha256: its chain (recomputed
    here as it was then stored) still verifies, and the report says the text is not covered."""
    doc = _bundle(api, answered)
    root = doc["runs"][0]
    del root["events"][-1]["data"]["content_sha256"]
    chain = GENESIS_HASH
    for event in root["events"]:
        event["previous_hash"] = chain
        chain = event["hash"] = event_hash(chain, root["run"]["id"], event["seq"], event["type"],
                                           event["data"],
                                           datetime.fromisoformat(event["created_at"]))
    root["run"]["last_event_hash"] = chain
    doc["heads"][root["run"]["id"]]["last_event_hash"] = chain
    code, out = _verify(tmp_path, capsys, doc)
    assert code == 0, out
    assert "NOTE the answer's text is not covered by the chain" in out, out


def test_who_may_download_a_bundle(api, answered):
    path = f"/api/messages/{answered['message_id']}/evidence"
    for token in (api.alice, api.viewer, api.admin):
        assert api.get(path, token).status == 200
    reply = api.get(path, api.bob)
    assert reply.status == 404 and reply.json()["error"]["code"] == "not_found"
    reply = api.get(path, api.executor)
    assert reply.status == 403 and reply.json()["error"]["code"] == "forbidden"
    assert api.get(path).status == 401
    reply = api.get(f"/api/messages/{answered['user_message_id']}/evidence", api.alice)
    assert reply.status == 422 and reply.json()["error"]["code"] == "not_an_assistant_message"
    reply = api.get(f"/api/messages/{answered['user_message_id']}/evidence", api.bob)
    assert reply.status == 404  # another owner's message: nothing leaks, not even its role
    assert api.get("/api/messages/msg_nope/evidence", api.viewer).status == 404


def _components(tree, wanted_id):
    """Every component (its props) with this id, anywhere in a Dash callback response."""
    if isinstance(tree, dict):
        props = tree.get("props")
        found = [props] if isinstance(props, dict) and props.get("id") == wanted_id else []
        return found + [c for v in tree.values() for c in _components(v, wanted_id)]
    if isinstance(tree, list):
        return [c for v in tree for c in _components(v, wanted_id)]
    return []


def test_the_provenance_page_links_the_download_and_the_cookie_session_gets_it(db, answered):
    from support.dashboards import tokens

    app = make_app(db)
    client = logged_in(app, tokens(db)["viewer"])
    message_id = answered["message_id"]
    call = dash_request([("message-body", "children")], [("message-id", "data", message_id)],
                        changed=["message-id.data"])
    reply = client.post("/_dash-update-component", json=call, headers=csrf_headers(client))
    assert reply.status_code == 200
    href = f"/api/messages/{message_id}/evidence"
    (link,) = _components(reply.get_json(), "message-evidence")
    assert link["children"] == "Download evidence" and link["href"] == href
    assert link["download"] == f"evidence-{message_id}.json"
    download = client.get(href)  # the login cookie alone, like the browser following the link
    assert download.status_code == 200
    assert download.headers["Content-Disposition"].startswith("attachment;")
    assert verify_bundle(download.get_json()).ok
