"""A message post as a transaction of its own (``ingest.runs.post_message_alone``).

On PostgreSQL a post with nothing to write besides the run's one statement is its look-up and
that statement on a connection in autocommit. These tests check which statements are sent and
whether a transaction is open when each is, that a duplicate committed between the look-up and
the insert (made from inside the spy that sees the post's statements) is answered as its replay
or its conflict, that posts the one statement cannot hold (rate limit, context, redaction) take
the transaction, and that both ways store the same rows and refuse the same input. The tests of
results run on SQLite too, where every post is an ordinary write transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import func, select
from support.factories import make_agent, make_session, post
from support.ledger import assert_chains_ok, events
from support.races import run_together
from support.statements import statements_sent

from agentledger.core.database import Database
from agentledger.core.errors import IdempotencyConflict, NotFound, UnknownAgent
from agentledger.core.redaction import parse_rules
from agentledger.core.schema import AgentRun, ContextBlob, Message, RateLimitWindow, RunEvent
from ingest.runs import ContextItem, post_message_alone


def _path(session_id: str) -> str:
    return f"/api/sessions/{session_id}/messages"


def _post_alone(db, session_id: str, content: str = "hello", *, key: str = "k-1", **extra):
    return post_message_alone(db, owner_id="alice", session_id=session_id, idempotency_key=key,
                              content=content, request=(_path(session_id), {"content": content}),
                              **extra)


@contextmanager
def commits_counted() -> Iterator[list[int]]:
    """psycopg commits made by this thread inside the block: the code under test runs here,
    while a thread another test left behind in this process (a pool, a listener) may commit
    on its own connections at any moment."""
    counted = [0]
    commit = psycopg.Connection.commit
    mine = threading.get_ident()

    def counting(conn):
        if threading.get_ident() == mine:
            counted[0] += 1
        return commit(conn)

    psycopg.Connection.commit = counting  # type: ignore[method-assign]
    try:
        yield counted
    finally:
        psycopg.Connection.commit = commit  # type: ignore[method-assign]


def _rows(db, run_id: str) -> dict:
    with db.read() as s:
        run = s.execute(select(AgentRun).where(AgentRun.id == run_id)).scalar_one()
        messages = s.execute(select(Message.role, Message.content)
                             .where(Message.run_id == run_id)).all()
        return {"status": run.status, "input": run.input, "agent": run.agent_id,
                "snapshot": run.agent_execution_snapshot, "pack": run.context_pack_snapshot,
                "seq": run.last_event_seq, "messages": [tuple(m) for m in messages],
                "events": [e.type for e in events(db, run_id)]}


def _count(db, table) -> int:
    with db.read() as s:
        return s.execute(select(func.count()).select_from(table)).scalar_one()


def test_a_post_alone_is_its_look_up_and_one_statement_in_autocommit_on_postgres(pg_db):
    make_agent(pg_db, "echo")
    session_id = make_session(pg_db)
    states: list[tuple[bool, str]] = []
    with commits_counted() as commits, statements_sent(pg_db, states=states) as sent:
        posted = _post_alone(pg_db, session_id)
    assert not posted.replayed
    assert [q.lstrip().split()[0] for q in sent] == ["SELECT", "WITH"], sent
    assert states == [(True, "IDLE")] * 2  # autocommit, no transaction open around them
    assert "INSERT INTO agent_run" in sent[1] and "pg_notify" in sent[1]
    assert commits == [0]
    assert _rows(pg_db, posted.run_id)["events"] == ["run.queued"]
    assert_chains_ok(pg_db, posted.run_id)


def test_the_transaction_path_is_what_the_spy_would_see_otherwise_on_postgres(pg_db):
    """The spy can tell the two apart: the same post with a rate limit is a transaction."""
    make_agent(pg_db, "echo")
    session_id = make_session(pg_db)
    states: list[tuple[bool, str]] = []
    with commits_counted() as commits, statements_sent(pg_db, states=states):
        _post_alone(pg_db, session_id, rate_limit_per_minute=100)
    assert commits == [1]
    assert states and not any(autocommit for autocommit, _ in states)
    assert _count(pg_db, RateLimitWindow) == 1


def test_a_post_alone_stores_what_a_post_in_a_transaction_stores(db):
    make_agent(db, "echo")
    alone = _post_alone(db, make_session(db), "same words", key="a")
    in_transaction = post(db, make_session(db), "same words", key="b")
    got, expected = _rows(db, alone.run_id), _rows(db, in_transaction.run_id)
    assert got == expected
    assert got["messages"] == [("user", "same words")]
    assert (alone.agent_id, alone.agent_name) == (in_transaction.agent_id,
                                                  in_transaction.agent_name)
    assert_chains_ok(db)


def test_a_post_alone_replays_and_refuses_as_a_post_does_and_writes_nothing_more(db):
    make_agent(db, "echo")
    session_id = make_session(db)
    first = _post_alone(db, session_id, "once", key="k")
    again = _post_alone(db, session_id, "once", key="k")
    assert again.replayed and (again.run_id, again.message_id) == (first.run_id, first.message_id)
    with pytest.raises(IdempotencyConflict):
        _post_alone(db, session_id, "another body", key="k")
    with pytest.raises(NotFound):
        _post_alone(db, "ses_missing", key="k2")
    with pytest.raises(NotFound):  # another owner's session is not visible to this caller
        _post_alone(db, session_id, key="k3", visible_to="mallory")
    with pytest.raises(UnknownAgent):
        _post_alone(db, session_id, key="k4", agent_id="no-such-agent")
    assert (_count(db, AgentRun), _count(db, Message), _count(db, RunEvent)) == (1, 1, 1)


@pytest.mark.parametrize("same_body", [True, False])
def test_a_duplicate_committed_after_the_look_up_is_answered_by_the_transaction_on_postgres(
        pg_db, same_body):
    make_agent(pg_db, "echo")
    session_id = make_session(pg_db)
    busy = threading.local()
    competitors: list[str] = []

    def duplicate_first(sql: str) -> None:
        if "INSERT INTO agent_run" in sql and not competitors and not getattr(busy, "on", False):
            busy.on = True
            try:  # another request with the key commits between our look-up and our insert
                competitors.append(post(pg_db, session_id, "mine" if same_body else "theirs",
                                        key="k").run_id)
            finally:
                busy.on = False

    states: list[tuple[bool, str]] = []
    with statements_sent(pg_db, before=duplicate_first, states=states) as sent:
        if same_body:
            posted = _post_alone(pg_db, session_id, "mine", key="k")
        else:
            with pytest.raises(IdempotencyConflict):
                _post_alone(pg_db, session_id, "mine", key="k")
    ours = [q for q, (autocommit, _) in zip(sent, states, strict=True) if autocommit]
    assert len(ours) == 2 and "INSERT INTO agent_run" in ours[1]  # it tried, and lost
    if same_body:
        assert posted.replayed and posted.run_id == competitors[0]
    assert _count(pg_db, AgentRun) == 1 and _count(pg_db, Message) == 1
    assert _rows(pg_db, competitors[0])["events"] == ["run.queued"]


def test_concurrent_identical_posts_alone_create_one_run(db):
    make_agent(db, "echo")
    session_id = make_session(db)
    answers = run_together(12, lambda _i: _post_alone(db, session_id, "together", key="shared"))
    assert [a for a in answers if isinstance(a, Exception)] == []
    assert len({a.run_id for a in answers}) == 1
    assert sum(not a.replayed for a in answers) == 1
    assert (_count(db, AgentRun), _count(db, Message), _count(db, RunEvent)) == (1, 1, 1)


def test_a_post_with_context_takes_the_transaction_and_stores_its_blobs(db):
    make_agent(db, "echo")
    session_id = make_session(db)
    posted = post_message_alone(
        db, owner_id="alice", session_id=session_id, idempotency_key="ctx", content="q",
        request=(_path(session_id), {"content": "q"}),
        context=[ContextItem("doc-1", "Doc", "the body", 1)])
    assert [i["id"] for i in _rows(db, posted.run_id)["pack"]["items"]] == ["doc-1"]
    with db.read() as s:
        assert s.execute(select(ContextBlob.content)).scalars().all() == ["the body"]


def test_a_post_with_redaction_rules_takes_the_transaction_and_is_redacted(db_url):
    redacting = Database(db_url, redaction_rules=parse_rules("email"))
    try:
        make_agent(redacting, "echo")
        session_id = make_session(redacting)
        posted = _post_alone(redacting, session_id, "write to ann@example.com")
        row = _rows(redacting, posted.run_id)
        assert "ann@example.com" not in row["input"] and row["input"].startswith("write to ")
        with redacting.read() as s:
            assert s.execute(select(AgentRun.redaction_count)).scalar_one() == 1
    finally:
        redacting.dispose()
