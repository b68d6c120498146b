"""Threads with memory (CONTRACT §7): a run's ``history`` is its thread's earlier turns, read
when it is claimed, returned by the claim route and the provenance answer, shown on the
provenance page; ``current_run()`` from a run's thread and from asyncio tasks inside it.

Histories are built through the real write path on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from datetime import timedelta

import pytest
from support import history as h
from support.api import append, claim_run, open_session, post_message
from support.dashboards import call, logged_in, make_app, texts, tokens
from support.factories import make_agent, make_session, post
from support.processes import ExecutorPool, wait_terminal

from agentledger.agent_kinds import available_kinds, current_run, validate_definition
from ingest.agents import AgentDefinition, register_agent
from ingest.leases import claim_run as claim_one
from queries.provenance import message_provenance
from queries.thread_history import thread_history


def remember(db, agent_id: str, **params) -> str:
    """An agent whose definition carries ``params`` (e.g. ``history_limit``)."""
    with h.write_at(db, h.T0 - timedelta(days=30)) as s:
        register_agent(s, agent_id, AgentDefinition(name=agent_id.title(), kind="echo",
                                                    params=params))
    return agent_id


def claimed(db, run_id: str, when, executor: str = "worker-1"):
    with h.write_at(db, when) as s:
        return claim_one(s, run_id, executor, lease_seconds=h.LEASE)


def turns(history: list[dict]) -> list[tuple[str, str, str]]:
    return [(t["role"], t["content"], t["run_id"]) for t in history]


@pytest.fixture
def conversation(db):
    """One session: q1 answered a1, q2 failed (no answer), q3 answered a3; a decoy session."""
    remember(db, "mem")
    chat = h.chat(db, owner="alice", agent_id="mem")
    t = h.at_seconds
    first = h.answered(db, chat, "q1", "a1", owner="alice", when=t(0))
    failed = h.ask(db, chat, "q2", owner="alice", when=t(10))
    h.start(db, failed.run_id, t(11))
    h.fail(db, failed.run_id, t(12))
    third = h.answered(db, chat, "q3", "a3", owner="alice", when=t(20))
    decoy_chat = h.chat(db, owner="alice", agent_id="mem")
    h.answered(db, decoy_chat, "elsewhere", "not this thread", owner="alice", when=t(5))
    return {"chat": chat, "first": first, "failed": failed.run_id, "third": third}


def test_a_runs_history_is_its_threads_earlier_turns_oldest_first(db, conversation):
    c = conversation
    fourth = h.ask(db, c["chat"], "q4", owner="alice", when=h.at_seconds(30))
    run = claimed(db, fourth.run_id, h.at_seconds(31))
    # the failed run's question is remembered, its (absent) answer is not; the decoy is not
    assert turns(run.history) == [
        ("user", "q1", c["first"].run_id), ("assistant", "a1", c["first"].run_id),
        ("user", "q2", c["failed"]),
        ("user", "q3", c["third"].run_id), ("assistant", "a3", c["third"].run_id),
    ]
    assert all(set(t) == {"role", "content", "run_id", "created_at"} for t in run.history)
    assert run.history[0]["created_at"] == h.at_seconds(0).isoformat()
    # each earlier run's own history was what came before it
    with db.read() as s:
        assert thread_history(s, c["first"].run_id) == []
        assert turns(thread_history(s, c["third"].run_id)) == turns(run.history)[:3]
        ids = [t["message_id"] for t in thread_history(s, fourth.run_id)]
    assert ids[0] == c["first"].user_message_id and ids[1] == c["first"].answer_id


def test_history_limit_keeps_the_newest_turns(db):
    remember(db, "short", history_limit=2)
    remember(db, "none", history_limit=0)
    chat = h.chat(db, owner="alice", agent_id="short")
    for n in range(3):
        h.answered(db, chat, f"q{n}", f"a{n}", owner="alice", when=h.at_seconds(10 * n))
    short = h.ask(db, chat, "next", owner="alice", when=h.at_seconds(40))
    assert [t["content"] for t in claimed(db, short.run_id, h.at_seconds(41)).history] == ["q2", "a2"]
    h.complete(db, short.run_id, h.at_seconds(42), "done")
    # the limit is the agent of *this* run's (a message may name another agent)
    none = h.ask(db, chat, "again", owner="alice", when=h.at_seconds(50), agent_id="none")
    assert claimed(db, none.run_id, h.at_seconds(51)).history == []
    with db.read() as s:
        assert len(thread_history(s, none.run_id, limit=50)) == 8


def test_the_default_limit_is_fifty_turns(db):
    remember(db, "mem")
    chat = h.chat(db, owner="alice", agent_id="mem")
    for n in range(26):
        h.answered(db, chat, f"q{n}", f"a{n}", owner="alice", when=h.at_seconds(10 * n))
    last = h.ask(db, chat, "last", owner="alice", when=h.at_seconds(1000))
    history = claimed(db, last.run_id, h.at_seconds(1001)).history
    assert len(history) == 50 and history[0]["content"] == "q1" and history[-1]["content"] == "a25"


def test_a_child_runs_thread_is_its_own_and_starts_empty(db, conversation):
    c = conversation
    parent = h.ask(db, c["chat"], "delegate it", owner="alice", when=h.at_seconds(30))
    assert len(claimed(db, parent.run_id, h.at_seconds(31)).history) == 5
    child = h.delegate(db, parent.run_id, "mem", h.at_seconds(32))
    assert claimed(db, child, h.at_seconds(33), "worker-2").history == []


def test_provenance_says_what_was_in_memory_with_linkable_message_ids(db, conversation):
    c = conversation
    with db.read() as s:
        found = message_provenance(s, c["third"].answer_id)
    assert turns(found["history"]) == [("user", "q1", c["first"].run_id),
                                       ("assistant", "a1", c["first"].run_id),
                                       ("user", "q2", c["failed"])]
    assert found["history"][1]["message_id"] == c["first"].answer_id


def test_the_provenance_page_shows_the_memory_and_links_each_answer(db, conversation):
    client = logged_in(make_app(db), tokens(db)["viewer"])
    c = conversation
    response = call(client, [("message-body", "children")],
                    [("message-id", "data", c["third"].answer_id)], changed=["message-id.data"])
    body = response["message-body"]["children"]
    shown = texts(body)
    assert "In memory when it answered" in shown
    memory = shown[shown.index("In memory when it answered"):]
    assert {"q1", "a1", "q2"} <= set(memory) and "q3" not in memory
    assert f"/messages/{c['first'].answer_id}" in str(body)
    first = call(client, [("message-body", "children")],
                 [("message-id", "data", c["first"].answer_id)], changed=["message-id.data"])
    assert "Nothing in memory" in texts(first["message-body"]["children"])


def test_the_claim_route_returns_the_history(api):
    chat = open_session(api, api.alice, title="memory")["id"]
    first = post_message(api, api.alice, chat, "remember 7")["run_id"]
    claim_run(api, api.executor, first, "remote-1")
    reply = append(api, api.executor, first, "remote-1",
                   [("message.delta", {"text": "noted"}), ("run.completed", {})])
    assert reply.status == 200
    second = post_message(api, api.alice, chat, "what number?")["run_id"]
    entry = claim_run(api, api.executor, second, "remote-1")
    assert [(t["role"], t["content"], t["run_id"]) for t in entry["history"]] == [
        ("user", "remember 7", first), ("assistant", "noted", first)]
    answer_id = api.get(f"/api/agent-runs/{first}", api.alice).json()["final_message_id"]
    provenance = api.get(f"/api/messages/{answer_id}/provenance", api.alice).json()
    assert provenance["history"] == []


def test_history_limit_is_validated_at_registration():
    validate_definition("echo", {"history_limit": 10})
    for bad in (-1, "10", 1.5, True, 10_000):
        with pytest.raises(ValueError, match="history_limit"):
            validate_definition("echo", {"history_limit": bad})


# --------------------------------------------------------------------------------------------
# the executor: history in RunContext, current_run() from the run's thread and asyncio tasks
# --------------------------------------------------------------------------------------------


@pytest.fixture
def test_kind(monkeypatch):
    available_kinds.cache_clear()

    def register(name, fn):
        monkeypatch.setitem(available_kinds(), name, fn)

    yield register
    available_kinds.cache_clear()


def test_the_executor_gives_each_run_its_history_and_current_run(db, test_kind):
    seen: dict[str, dict] = {}

    def recall(ctx):
        async def deep_inside_a_framework():
            async def tool():
                return current_run()
            return await asyncio.create_task(tool())

        from_task = asyncio.run(deep_inside_a_framework())
        # a thread the agent starts itself inherits no context (Python semantics) unless the
        # agent hands it on with copy_context()
        in_threads = {}

        def look(name):
            try:
                in_threads[name] = current_run() is ctx
            except LookupError:
                in_threads[name] = "LookupError"

        bare = threading.Thread(target=look, args=("bare",))
        handed = threading.Thread(target=contextvars.copy_context().run, args=(look, "handed"))
        for t in (bare, handed):
            t.start()
            t.join()
        seen[ctx.input] = {"history": list(ctx.history), "plain": current_run() is ctx,
                           "task": from_task is ctx, "threads": in_threads}
        ctx.say(f"heard {ctx.input} after {len(ctx.history)} turns")

    test_kind("recall", recall)
    make_agent(db, "recall", kind="recall")
    chat = make_session(db, agent_id="recall")
    with ExecutorPool(db) as pool:
        pool.start(concurrency=2)
        first = post(db, chat, "one")
        wait_terminal(db, first.run_id)
        second = post(db, chat, "two")
        wait_terminal(db, second.run_id)
    assert seen["one"] == {"history": [], "plain": True, "task": True,
                           "threads": {"bare": "LookupError", "handed": True}}
    assert [(t["role"], t["content"]) for t in seen["two"]["history"]] == [
        ("user", "one"), ("assistant", "heard one after 0 turns")]
    assert seen["two"]["plain"] and seen["two"]["task"]
    with pytest.raises(LookupError):
        current_run()  # outside any run
