"""Several LangGraph interrupts pending at once (two nodes of one step call ``interrupt()``):
the run reports every one of them with its id, and the session's next message answers them
by id (``Command(resume={id: answer})``); a message that does not is refused without touching
the thread, which stays answerable. Real LangGraph, the real executor, SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from support.factories import make_agent, make_session
from support.frameworks import answer_of, ask
from support.processes import events

GRAPH = "framework_agents.lg_side_calls:parallel_asking"
DATES = "Which dates?"
BUDGET = {"question": "Which budget?", "currency": "EUR"}


@pytest.fixture
def session(fw_db):
    make_agent(fw_db, "planner", kind="langgraph", params={"graph": GRAPH})
    return make_session(fw_db, agent_id="planner")


@pytest.fixture
def executors(fw_executors):
    fw_executors.start()
    return fw_executors


def completed(db, session_id: str, text: str) -> tuple[str, dict]:
    run_id, end = ask(db, session_id, text)
    assert end.type == "run.completed", end
    return run_id, end.data


def pending_ids(data: dict) -> dict:
    """The run's pending interrupts, value → id."""
    return {json.dumps(i["value"], sort_keys=True): i["id"] for i in data["interrupts"]}


def ask_both(db, session_id: str) -> dict:
    """Start the graph: both nodes interrupt; checks the report, returns value → id."""
    run_id, data = completed(db, session_id, "plan a trip")
    assert data["awaiting_input"] is True
    assert len(data["interrupts"]) == 2
    ids = pending_ids(data)
    assert set(ids) == {json.dumps(DATES), json.dumps(BUDGET, sort_keys=True)}
    assert all(len(interrupt_id) == 32 for interrupt_id in ids.values())  # LangGraph's ids
    # ``interrupt`` is kept for clients that read one: the first of the list.
    assert data["interrupt"] == data["interrupts"][0]["value"]
    # The answer is {id: value}: the shape of the message that answers them.
    assert json.loads(answer_of(db, run_id)) == {i["id"]: i["value"] for i in data["interrupts"]}
    return {"dates": ids[json.dumps(DATES)], "budget": ids[json.dumps(BUDGET, sort_keys=True)]}


def test_both_answered_by_id_in_one_message(fw_db, session, executors):
    ids = ask_both(fw_db, session)
    run_id, data = completed(fw_db, session, json.dumps({ids["dates"]: "May",
                                                          ids["budget"]: 2000}))
    assert "awaiting_input" not in data
    assert answer_of(fw_db, run_id) == "Plan with budget: 2000 and dates: May."


def test_one_answered_by_id_then_the_other_with_a_plain_message(fw_db, session, executors):
    ids = ask_both(fw_db, session)
    # Answering one leaves the other pending: reported as a single interrupt, as always.
    run_id, data = completed(fw_db, session, json.dumps({ids["budget"]: "2000 EUR"}))
    assert data["awaiting_input"] is True and data["interrupt"] == DATES
    assert "interrupts" not in data
    assert answer_of(fw_db, run_id) == DATES
    # One pending: the message is its answer.
    run_id, data = completed(fw_db, session, "early May")
    assert "awaiting_input" not in data
    assert answer_of(fw_db, run_id) == "Plan with budget: 2000 EUR and dates: early May."


@pytest.mark.parametrize("reply", [
    "May please",  # plain text: which interrupt would it answer?
    '{"dates": "May"}',  # a JSON object, but not keyed by pending interrupt ids
    '{"0123456789abcdef0123456789abcdef": "May"}',  # an id that is not pending
])
def test_a_message_that_does_not_answer_by_id_is_refused_and_the_thread_stays_usable(
        fw_db, session, executors, reply):
    ids = ask_both(fw_db, session)
    run_id, end = ask(fw_db, session, reply)
    assert end.type == "run.failed", end
    error = end.data["error"]
    assert error["code"] == "agent_error"
    assert error["message"].startswith("2 interrupts of the graph are waiting for an answer")
    assert ids["dates"] in error["message"] and ids["budget"] in error["message"]
    # Refused before the graph ran: only the resolution was written.
    kinds = [e.type for e in events(fw_db, run_id)]
    assert kinds == ["run.queued", "run.started", "agent.resolved", "run.failed"], kinds
    # The thread is as it was (the next run starts from the same checkpoint), the same two
    # interrupts still pending, and a message that answers them by id resumes the graph.
    run_id_next, data = completed(fw_db, session, json.dumps({ids["dates"]: "June",
                                                               ids["budget"]: 900}))
    assert answer_of(fw_db, run_id_next) == "Plan with budget: 900 and dates: June."
    assert checkpoint_of(fw_db, run_id_next) == checkpoint_of(fw_db, run_id)


def checkpoint_of(db, run_id: str) -> str:
    """The checkpoint the run started from (its ``agent.resolved``)."""
    return next(e.data["checkpoint_id"] for e in events(db, run_id) if e.type == "agent.resolved")
