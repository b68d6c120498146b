"""Run creation: one message = one run, idempotent, snapshots frozen in the same transaction."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from support.factories import make_agent, make_session, post
from support.ledger import counts, events, message_row, run_row, session_row, snapshot_state

from agentledger.core.errors import IdempotencyConflict, NotFound, UnknownAgent
from agentledger.core.hashing import sha256_hex, snapshot_sha256
from agentledger.core.schema import AgentRun, ContextBlob, Message, RunEvent
from ingest.agents import AgentDefinition, add_agent_version
from ingest.runs import ContextItem, idempotency_key_hash, post_message, request_checksum
from ingest.sessions import delete_session, update_session


class Rollback(Exception):
    pass


@pytest.fixture
def chat(db):
    make_agent(db, "echo", name="Echo")
    return make_session(db, owner="alice", agent_id="echo")


def test_post_writes_message_run_queued_event_and_snapshots(db, chat):
    context = [ContextItem(id="doc-1", title="Doc one", content="alpha", version=3),
               ContextItem(id="doc-2", title="Doc two", content="beta")]
    posted = post(db, chat, "hello there", key="k1", context=context)
    assert posted.replayed is False
    assert posted.run_id.startswith("run_") and posted.message_id.startswith("msg_")
    assert (posted.agent_id, posted.agent_name) == ("echo", "Echo")

    run = run_row(db, posted.run_id)
    chat_row = session_row(db, chat)
    assert run.status == "queued"
    assert run.session_id == chat and run.thread_id == chat_row.thread_id
    assert run.root_run_id == run.id and run.parent_run_id is None
    assert run.owner_id == "alice" and run.agent_id == "echo" and run.agent_version == 1
    assert run.input == "hello there" and run.user_message_id == posted.message_id
    assert run.last_event_seq == 1
    assert run.idempotency_key_hash == idempotency_key_hash("k1") != "k1"
    assert run.executor_instance_id is None and run.lease_expires_at is None
    assert run.finished_at is None and run.final_message_id is None

    snap = run.agent_execution_snapshot
    assert snap["agent_id"] == "echo" and snap["name"] == "Echo" and snap["version"] == 1
    assert snap["kind"] == "echo" and len(snap["content_hash"]) == 64
    pack = run.context_pack_snapshot
    assert [i["id"] for i in pack["items"]] == ["doc-1", "doc-2"]
    assert pack["items"][0] == {"id": "doc-1", "title": "Doc one", "version": 3,
                                "sha256": sha256_hex("alpha")}
    assert "content" not in pack["items"][0]
    assert len(pack["pack_hash"]) == 64

    message = message_row(db, posted.message_id)
    assert (message.role, message.content, message.run_id) == ("user", "hello there", run.id)
    assert message.session_id == chat and message.thread_id == run.thread_id

    evs = events(db, posted.run_id)
    assert [(e.seq, e.type) for e in evs] == [(1, "run.queued")]
    assert evs[0].data == {"agent_id": "echo", "session_id": chat, "parent_run_id": None,
                           "input_sha256": sha256_hex("hello there"),
                           "agent_snapshot_sha256": snapshot_sha256(run.agent_execution_snapshot),
                           "context_pack_sha256": snapshot_sha256(pack)}

    with db.read() as s:
        blobs = dict(s.execute(select(ContextBlob.sha256, ContextBlob.content)).all())
    assert blobs == {sha256_hex("alpha"): "alpha", sha256_hex("beta"): "beta"}


def test_post_is_one_transaction_with_the_callers(db, chat):
    """Everything post_message writes goes away together when the caller's transaction fails."""
    before = counts(db)
    with pytest.raises(Rollback), db.write() as s:
        posted = post_message(
            s, owner_id="alice", session_id=chat, idempotency_key="k", checksum="c" * 64,
            content="hi", context=[ContextItem(id="d", title="t", content="body")],
        )
        assert s.execute(select(AgentRun.id).where(AgentRun.id == posted.run_id)).first()
        raise Rollback
    assert counts(db) == before
    with db.read() as s:
        for model in (AgentRun, Message, RunEvent):
            assert s.execute(select(model)).first() is None


def test_snapshots_are_frozen_against_later_agent_versions(db, chat):
    first = post(db, chat, "one", context=[ContextItem(id="d", title="t", content="v1")])
    old = run_row(db, first.run_id)
    with db.write() as s:
        add_agent_version(s, "echo", AgentDefinition(name="Echo Two", kind="scripted",
                                                     model="m-2", params={"steps": []}))
    second = post(db, chat, "two")
    assert second.agent_name == "Echo Two"
    new = run_row(db, second.run_id)
    assert new.agent_version == 2 and new.agent_execution_snapshot["name"] == "Echo Two"
    assert new.agent_execution_snapshot["content_hash"] != old.agent_execution_snapshot[
        "content_hash"]

    again = run_row(db, first.run_id)
    assert again.agent_execution_snapshot == old.agent_execution_snapshot
    assert again.agent_execution_snapshot["version"] == 1
    assert again.agent_execution_snapshot["name"] == "Echo"
    assert again.context_pack_snapshot == old.context_pack_snapshot
    assert again.agent_version == 1


def test_replay_returns_the_original_and_writes_nothing(db, chat):
    first = post(db, chat, "hello", key="same")
    before = snapshot_state(db)
    again = post(db, chat, "hello", key="same")
    assert again.replayed is True
    assert (again.run_id, again.message_id, again.agent_id, again.agent_name) == (
        first.run_id, first.message_id, first.agent_id, first.agent_name)
    assert again.response() == first.response()
    assert snapshot_state(db) == before


def test_replay_survives_a_later_default_agent_change(db, chat):
    make_agent(db, "other", name="Other")
    first = post(db, chat, "hello", key="same")
    with db.write() as s:
        update_session(s, chat, owner_id="alice", agent_id="other")
    again = post(db, chat, "hello", key="same")
    assert again.replayed and again.run_id == first.run_id and again.agent_id == "echo"


def test_an_admin_posting_into_a_users_session_acts_in_that_users_key_space(db, chat):
    mine = post(db, chat, "hello", key="k", owner="alice")
    with db.write() as s:  # an admin (visible_to=None) retries the same request under its name
        again = post_message(s, owner_id="root-admin", session_id=chat, idempotency_key="k",
                             checksum=request_checksum(f"/api/sessions/{chat}/messages",
                                                       {"content": "hello"}),
                             content="hello", visible_to=None)
    assert again.replayed and again.run_id == mine.run_id
    assert run_row(db, mine.run_id).owner_id == "alice"


def test_a_deleted_session_takes_no_replays_either(db, chat):
    post(db, chat, "hello", key="same")
    with db.write() as s:
        delete_session(s, chat, owner_id="alice")
    before = snapshot_state(db)
    with pytest.raises(NotFound):
        post(db, chat, "hello", key="same")
    assert snapshot_state(db) == before


def test_same_key_different_request_is_a_conflict_and_writes_nothing(db, chat):
    post(db, chat, "hello", key="same")
    before = snapshot_state(db)
    with pytest.raises(IdempotencyConflict):
        post(db, chat, "a different message", key="same")
    with pytest.raises(IdempotencyConflict), db.write() as s:
        post_message(s, owner_id="alice", session_id=chat, idempotency_key="same",
                     checksum=request_checksum("/elsewhere", {"content": "hello"}), content="hello")
    assert snapshot_state(db) == before


def test_idempotency_keys_are_per_owner(db, chat):
    bobs = make_session(db, owner="bob")
    a = post(db, chat, "hello", key="shared", owner="alice")
    b = post(db, bobs, "hello", key="shared", owner="bob")
    assert not a.replayed and not b.replayed and a.run_id != b.run_id


def test_unknown_session_is_not_found_and_writes_nothing(db, chat):
    before = snapshot_state(db)
    with pytest.raises(NotFound):
        post(db, "sess_doesnotexist", "hello")
    assert snapshot_state(db) == before


def test_another_owners_session_is_not_found(db, chat):
    before = snapshot_state(db)
    with pytest.raises(NotFound), db.write() as s:
        post_message(s, owner_id="bob", session_id=chat, idempotency_key="k", checksum="c" * 64,
                     content="hi", visible_to="bob")
    assert snapshot_state(db) == before
    # The same call as its owner (or an admin: visible_to=None) works.
    with db.write() as s:
        mine = post_message(s, owner_id="alice", session_id=chat, idempotency_key="k",
                            checksum="c" * 64, content="hi", visible_to="alice")
    assert run_row(db, mine.run_id).owner_id == "alice"


def test_deleted_session_takes_no_new_messages(db, chat):
    with db.write() as s:
        delete_session(s, chat, owner_id="alice")
    with pytest.raises(NotFound):
        post(db, chat, "hello")


def test_unknown_agent_override_is_refused_and_writes_nothing(db, chat):
    before = snapshot_state(db)
    with pytest.raises(UnknownAgent):
        post(db, chat, "hello", agent_id="no-such-agent")
    assert snapshot_state(db) == before


def test_per_message_agent_override_is_for_that_run_only(db, chat):
    make_agent(db, "critic", name="Critic")
    override = post(db, chat, "judge this", agent_id="critic")
    assert (override.agent_id, override.agent_name) == ("critic", "Critic")
    run = run_row(db, override.run_id)
    assert run.agent_id == "critic" and run.agent_execution_snapshot["name"] == "Critic"
    assert events(db, override.run_id)[0].data["agent_id"] == "critic"
    assert session_row(db, chat).agent_id == "echo"
    default = post(db, chat, "and now?")
    assert default.agent_id == "echo" and run_row(db, default.run_id).agent_id == "echo"
    # Both runs share the session's one thread.
    assert run_row(db, default.run_id).thread_id == run.thread_id
