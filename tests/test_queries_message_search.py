"""queries.message_search: which answers match text, session, owner, agent, version and time?"""

from __future__ import annotations

from datetime import timedelta

import pytest
from support import history as h

from queries.common import TimeWindow
from queries.message_search import PREVIEW_CHARS, MessageSearch, search_messages


@pytest.fixture
def ledger(db):
    h.agent(db, "helper")
    h.agent(db, "other", names=("Other",))
    alice = h.chat(db, owner="alice", agent_id="helper")
    bob = h.chat(db, owner="bob", agent_id="helper")
    runs = {
        "r1": h.answered(db, alice, "refund policy?", "Refunds take 5 days.", owner="alice",
                         when=h.at_seconds(0)),
    }
    h.new_version(db, "helper", "Helper Pro", model="m2", when=h.at_seconds(100))
    runs["r2"] = h.answered(db, alice, "and now?", "Refunds are instant now.", owner="alice",
                            when=h.at_seconds(200))
    runs["r3"] = h.answered(db, bob, "shipping?", "Shipping is free.", owner="bob",
                            when=h.at_seconds(300), agent_id="other")
    runs["r4"] = h.answered(db, alice, "percent?", "100% of REFUNDS_are ok", owner="alice",
                            when=h.at_seconds(400))
    # Decoys: a user's message that mentions refunds, and a run that failed without an answer.
    failed = h.ask(db, bob, "refund refund refund", owner="bob", when=h.at_seconds(500))
    h.start(db, failed.run_id, h.at_seconds(501))
    h.fail(db, failed.run_id, h.at_seconds(502))
    return {"alice": alice, "bob": bob, **runs}


def ids(page):
    return [item["id"] for item in page.items]


def answers(ledger, *names):
    return [ledger[n].answer_id for n in names]


def find(db, **kwargs):
    with db.read() as s:
        return search_messages(s, MessageSearch(**kwargs), limit=kwargs.pop("limit", 50))


def test_text_is_a_case_insensitive_substring_of_answers_only(db, ledger):
    page = find(db, text="REFUND")
    assert ids(page) == answers(ledger, "r4", "r2", "r1")  # newest first; no user message
    assert page.next_cursor is None


def test_letters_of_every_script_match_in_either_case(db, ledger):
    # (SQLite's own lower() folds ASCII only: 'école' missed 'ÉCOLE' there, not on PostgreSQL)
    chat = h.chat(db, owner="carol", agent_id="helper")
    run = h.answered(db, chat, "words?", "Ünïcode héllo ÉCOLE Ελληνικά Привет", owner="carol",
                     when=h.at_seconds(600))
    for text in ("école", "HÉLLO", "ünïcode", "ελληνικά", "ПРИВЕТ", "привет"):
        assert ids(find(db, text=text)) == [run.answer_id], text
    assert ids(find(db, text="ecole")) == []  # folding case is not folding accents


def test_like_wildcards_in_the_text_are_literal(db, ledger):
    assert ids(find(db, text="100%")) == answers(ledger, "r4")
    assert ids(find(db, text="%")) == answers(ledger, "r4")
    assert ids(find(db, text="S_a")) == answers(ledger, "r4")
    assert ids(find(db, text="s_a")) == answers(ledger, "r4")
    assert ids(find(db, text="take_5")) == []


def test_items_name_the_agent_as_it_was_when_it_answered(db, ledger):
    items = {i["id"]: i for i in find(db, text="refund").items}
    first, second = items[ledger["r1"].answer_id], items[ledger["r2"].answer_id]
    assert (first["agent_id"], first["agent_name"], first["agent_version"]) == ("helper", "Helper", 1)
    assert (second["agent_name"], second["agent_version"]) == ("Helper Pro", 2)
    assert first["run_id"] == ledger["r1"].run_id
    assert first["run_status"] == "succeeded"
    assert first["owner_id"] == "alice" and first["session_id"] == ledger["alice"]
    assert first["content_preview"] == "Refunds take 5 days." and not first["content_truncated"]
    assert first["created_at"] == h.at_seconds(5).isoformat()


@pytest.mark.parametrize("filters, expected", [
    ({"owner_id": "bob"}, ["r3"]),
    ({"agent_id": "other"}, ["r3"]),
    ({"agent_id": "helper", "agent_version": 1}, ["r1"]),
    ({"agent_id": "helper", "agent_version": 2}, ["r4", "r2"]),
    ({"run_id": "nope"}, []),
])
def test_filters(db, ledger, filters, expected):
    assert ids(find(db, **filters)) == answers(ledger, *expected)


def test_session_filter(db, ledger):
    assert ids(find(db, session_id=ledger["bob"])) == answers(ledger, "r3")
    assert ids(find(db, session_id=ledger["alice"], text="instant")) == answers(ledger, "r2")


def test_time_window_is_half_open(db, ledger):
    window = TimeWindow(h.at_seconds(205), h.at_seconds(305))  # r2 answered at 205, r3 at 305
    assert ids(find(db, window=window)) == answers(ledger, "r2")
    assert ids(find(db, window=TimeWindow(h.at_seconds(205), None))) == answers(ledger, "r4", "r3", "r2")


def test_pages_walk_every_answer_once_in_order(db, ledger):
    seen, cursor = [], None
    with db.read() as s:
        while True:
            page = search_messages(s, MessageSearch(), limit=1, cursor=cursor)
            seen.extend(ids(page))
            cursor = page.next_cursor
            if cursor is None:
                break
    assert seen == answers(ledger, "r4", "r3", "r2", "r1")


def test_long_answers_are_previewed(db, ledger):
    long = h.answered(db, ledger["bob"], "essay", "x" * (PREVIEW_CHARS + 50), owner="bob",
                      when=h.at_seconds(600))
    [item] = find(db, text="xxx").items
    assert item["id"] == long.answer_id
    assert item["content_preview"] == "x" * PREVIEW_CHARS and item["content_truncated"]


def test_window_before_any_answer_is_empty(db, ledger):
    early = TimeWindow(None, h.at_seconds(0) - timedelta(seconds=1))
    assert find(db, window=early).items == []
