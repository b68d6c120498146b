"""queries.provenance: which answers an agent version or a context item produced, and how two
snapshots differ (the message → run direction is covered with the API)."""

from __future__ import annotations

import pytest
from support import history as h

from ingest.runs import ContextItem
from queries.provenance import (
    diff_agent_snapshots,
    diff_agent_versions,
    diff_context_packs,
    diff_runs,
    message_provenance,
    messages_by_agent_version,
    messages_by_context_item,
)

POLICY_V1 = ContextItem("kb-refunds", "Refund policy", "Refunds take 5 days.", 1)
POLICY_V2 = ContextItem("kb-refunds", "Refund policy", "Refunds are instant.", 2)
SLA = ContextItem("kb-sla", "Support SLA", "We answer within a day.", 1)


@pytest.fixture
def ledger(db):
    h.agent(db, "helper")
    h.agent(db, "other")
    chat = h.chat(db, owner="alice", agent_id="helper")
    runs = {"v1": h.answered(db, chat, "q1", "a1", owner="alice", when=h.at_seconds(0),
                             context=[POLICY_V1, SLA])}
    h.new_version(db, "helper", "Helper Pro", model="m2", when=h.at_seconds(50))
    runs["v2"] = h.answered(db, chat, "q2", "a2", owner="alice", when=h.at_seconds(100),
                            context=[POLICY_V2])
    runs["v2_no_context"] = h.answered(db, chat, "q3", "a3", owner="alice", when=h.at_seconds(200))
    # Decoys: another agent's answer with the same context, and an unanswered run of helper v2.
    runs["other"] = h.answered(db, chat, "q4", "a4", owner="alice", when=h.at_seconds(300),
                               agent_id="other", context=[SLA])
    pending = h.ask(db, chat, "q5", owner="alice", when=h.at_seconds(400))
    runs["pending"] = h.Run(pending.run_id, pending.message_id)
    return runs


def answer_ids(page):
    return [item["id"] for item in page.items]


def test_answers_of_an_agent_version(db, ledger):
    with db.read() as s:
        v1 = messages_by_agent_version(s, "helper", 1)
        v2 = messages_by_agent_version(s, "helper", 2)
        none = messages_by_agent_version(s, "helper", 3)
    assert answer_ids(v1) == [ledger["v1"].answer_id]
    assert answer_ids(v2) == [ledger["v2_no_context"].answer_id, ledger["v2"].answer_id]
    assert none.items == [] and none.next_cursor is None


def test_answers_of_an_agent_version_are_paged(db, ledger):
    with db.read() as s:
        first = messages_by_agent_version(s, "helper", 2, limit=1)
        second = messages_by_agent_version(s, "helper", 2, limit=1, cursor=first.next_cursor)
    assert answer_ids(first) == [ledger["v2_no_context"].answer_id]
    assert answer_ids(second) == [ledger["v2"].answer_id] and second.next_cursor is None


def test_answers_that_could_read_a_context_item(db, ledger):
    with db.read() as s:
        policy = messages_by_context_item(s, "kb-refunds")
        sla = messages_by_context_item(s, "kb-sla")
        unknown = messages_by_context_item(s, "kb-nothing")
    assert answer_ids(policy) == [ledger["v2"].answer_id, ledger["v1"].answer_id]
    assert answer_ids(sla) == [ledger["other"].answer_id, ledger["v1"].answer_id]
    assert unknown.items == []


def test_answers_that_read_an_exact_content_of_a_context_item(db, ledger):
    with db.read() as s:
        pack = message_provenance(s, ledger["v1"].answer_id)["context_pack_snapshot"]
        sha_v1 = next(i["sha256"] for i in pack["items"] if i["id"] == "kb-refunds")
        exact = messages_by_context_item(s, "kb-refunds", sha256=sha_v1)
        wrong_item = messages_by_context_item(s, "kb-sla", sha256=sha_v1)
    assert answer_ids(exact) == [ledger["v1"].answer_id]
    assert wrong_item.items == []


def test_message_provenance_is_unchanged(db, ledger):
    with db.read() as s:
        found = message_provenance(s, ledger["v1"].answer_id)
    assert found["agent"] == {"id": "helper", "name": "Helper", "version": 1}
    assert found["run"]["id"] == ledger["v1"].run_id
    assert [i["id"] for i in found["context_pack_snapshot"]["items"]] == ["kb-refunds", "kb-sla"]


def test_diff_between_the_snapshots_of_two_runs(db, ledger):
    with db.read() as s:
        diff = diff_runs(s, ledger["v1"].run_id, ledger["v2"].run_id)
        missing = diff_runs(s, ledger["v1"].run_id, "run_nope")
    assert diff["runs"] == [ledger["v1"].run_id, ledger["v2"].run_id]
    changed = {c["field"]: (c["before"], c["after"]) for c in diff["agent"]["changes"]}
    assert changed == {"name": ("Helper", "Helper Pro"), "model": ("m1", "m2"), "version": (1, 2)}
    assert diff["agent"]["same_definition"] is False
    context = diff["context"]
    assert context["same_pack"] is False
    assert [i["id"] for i in context["removed"]] == ["kb-sla"] and context["added"] == []
    [policy] = context["changed"]
    assert policy["id"] == "kb-refunds"
    assert (policy["before"]["version"], policy["after"]["version"]) == (1, 2)
    assert policy["before"]["sha256"] != policy["after"]["sha256"]
    assert context["unchanged"] == 0
    assert missing is None


def test_runs_of_the_same_version_and_pack_do_not_differ(db, ledger):
    with db.read() as s:
        diff = diff_runs(s, ledger["v2_no_context"].run_id, ledger["pending"].run_id)
    assert diff["agent"] == {"same_definition": True, "changes": []}
    assert diff["context"]["same_pack"] is True
    assert diff["context"]["added"] == diff["context"]["removed"] == diff["context"]["changed"] == []


def test_diff_between_two_versions_of_an_agent(db, ledger):
    with db.read() as s:
        diff = diff_agent_versions(s, "helper", 1, 2)
        same = diff_agent_versions(s, "helper", 2, 2)
        missing = diff_agent_versions(s, "helper", 1, 9)
    assert diff["agent_id"] == "helper" and diff["versions"] == [1, 2]
    assert {c["field"] for c in diff["changes"]} == {"name", "model", "version"}
    assert same["changes"] == [] and same["same_definition"]
    assert missing is None


def test_pure_snapshot_diffs():
    before = {"agent_id": "a", "name": "A", "version": 1, "model": "x", "content_hash": "h1"}
    after = {**before, "version": 2, "content_hash": "h2", "tools": [{"name": "search"}]}
    diff = diff_agent_snapshots(before, after)
    assert diff["changes"] == [
        {"field": "tools", "before": None, "after": [{"name": "search"}]},
        {"field": "version", "before": 1, "after": 2},
    ]
    assert not diff["same_definition"]
    renumbered = diff_agent_snapshots(before, {**before, "version": 5, "content_hash": "h1"})
    assert renumbered["same_definition"]
    item = {"id": "d", "title": "D", "version": 1, "sha256": "s"}
    packs = diff_context_packs({"items": [item], "pack_hash": "p"},
                               {"items": [item, {**item, "id": "e"}], "pack_hash": "q"})
    assert packs["added"] == [{**item, "id": "e"}] and packs["unchanged"] == 1
    assert diff_context_packs({}, {})["same_pack"] is True
