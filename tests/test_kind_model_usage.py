"""Every model response of a code-defined agent is one ``usage`` event, exactly once (CONTRACT
§7): LangGraph model calls whose reply never reaches ``messages`` (a classifier node, a router
edge, a streamed summary, parallel nodes), and Agents SDK agents run as tools
(``Agent.as_tool``), nested and in parallel. Real frameworks, fake models, the real executor on
SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from support.factories import make_agent, make_session
from support.frameworks import answer_of, answered
from support.processes import events

PRICES = {"input_per_million": 2.0, "output_per_million": 8.0}


def usages(db, run_id: str) -> list[dict]:
    return [e.data for e in events(db, run_id) if e.type == "usage"]


def calls(db, run_id: str) -> list[tuple[str | None, int, int]]:
    """The run's usage events as (model, input tokens, output tokens), sorted."""
    return sorted(((u["model"], u["input_tokens"], u["output_tokens"]) for u in usages(db, run_id)),
                  key=repr)


def assert_priced(usage_events: list[dict], priced: set[str]) -> None:
    for usage in usage_events:
        if usage["model"] in priced:
            expected = (usage["input_tokens"] * PRICES["input_per_million"]
                        + usage["output_tokens"] * PRICES["output_per_million"]) / 1e6
            assert usage["cost_usd"] == pytest.approx(expected), usage
        else:
            assert usage["cost_usd"] is None, usage  # unknown, never zero


def first_turn(db, executors, kind: str, params: dict, text: str) -> tuple[str, str]:
    """An agent of ``kind`` registered with ``params``, a session of it, an executor, and the
    session's first message answered: (the session, its run)."""
    make_agent(db, "agent", kind=kind, params=params)
    session = make_session(db, agent_id="agent")
    executors.start()
    return session, answered(db, session, text)


# ---- LangGraph: usage from the model calls themselves, not from the state's messages -------

LG = "framework_agents.lg_side_calls"
# (model, input tokens, output tokens) of each call of ``side_calls`` for a one-word question
# on a new thread: the classifier, the router and the summariser see the question alone, the
# answering model the thread's messages (one, then three on the next turn).
SIDE_CALLS = sorted([("fake-classifier", 10, 3), ("fake-router", 10, 3),
                     ("fake-model", 10, 5), ("fake-summariser", 10, 6)], key=repr)


def test_langgraph_calls_kept_out_of_messages_are_each_counted_once(fw_db, fw_executors):
    pricing = {m: PRICES for m in ("fake-classifier", "fake-router", "fake-model")}
    session, first = first_turn(fw_db, fw_executors, "langgraph",
                                {"graph": f"{LG}:side_calls", "pricing": pricing}, "hello")
    assert answer_of(fw_db, first) == "Hello, you said: hello."
    # A classifier node (reply in ``label``), a router edge (reply dropped), the answer (in
    # ``messages``) and a streamed summary (in ``summary``): four responses, four events.
    assert calls(fw_db, first) == SIDE_CALLS
    assert_priced(usages(fw_db, first), set(pricing))  # the summariser has no price: null

    # The next turn counts its own four calls, none of the thread's earlier ones again.
    second = answered(fw_db, session, "again")
    assert calls(fw_db, second) == sorted(
        [("fake-classifier", 10, 3), ("fake-router", 10, 3), ("fake-model", 30, 7),
         ("fake-summariser", 10, 6)], key=repr)


def test_langgraph_parallel_nodes_calls_are_each_counted_once(fw_db, fw_executors):
    make_agent(fw_db, "pair", kind="langgraph", params={"graph": f"{LG}:parallel_calls"})
    session = make_session(fw_db, agent_id="pair")
    fw_executors.start()
    run_id = answered(fw_db, session, "go")
    assert answer_of(fw_db, run_id) == "left side + right side"
    assert calls(fw_db, run_id) == [("fake-left", 10, 3), ("fake-right", 10, 3)]


# ---- the Agents SDK: usage of agents run as tools, at any depth -----------------------------

SDK = "framework_agents.sdk_agent_tools"
# The manager calls the specialist and the lead in parallel; the lead calls the researcher.
# Each agent answers with the model it names; the manager and the lead twice (their tool
# calls, then their answer).
TEAM_CALLS = sorted([("fake-sdk-model", 10, 1), ("fake-specialist", 10, 6),
                     ("fake-lead", 10, 1), ("fake-researcher", 10, 7),
                     ("fake-lead", 30, 7), ("fake-sdk-model", 50, 13)], key=repr)


def test_sdk_agents_run_as_tools_have_their_usage_counted_once(fw_db, fw_executors):
    pricing = {m: PRICES for m in ("fake-sdk-model", "fake-specialist", "fake-lead")}
    session, first = first_turn(fw_db, fw_executors, "openai-agents",
                                {"agent": f"{SDK}:manager", "pricing": pricing}, "go")
    assert answer_of(fw_db, first) == ("Researcher here, about: ask_researcher: ask_lead: go. | "
                                       "Specialist here, about: ask_specialist: go.")
    assert calls(fw_db, first) == TEAM_CALLS
    assert_priced(usages(fw_db, first), set(pricing))  # the researcher has no price: null
    # The top-level calls, as before: only what the tools' calls add is new.
    tool_calls = [e.data["name"] for e in events(fw_db, first) if e.type == "tool.call"]
    assert sorted(tool_calls) == ["ask_lead", "ask_specialist"]

    # The next turn on the same session: its own six calls, nothing of the first turn again.
    second = answered(fw_db, session, "again")
    models = sorted(model for model, _, _ in calls(fw_db, second))
    assert models == sorted(model for model, _, _ in TEAM_CALLS)


def test_an_agent_tool_with_a_run_config_of_its_own_is_counted_with_an_unknown_model(
        fw_db, fw_executors):
    make_agent(fw_db, "own-config", kind="openai-agents",
               params={"agent": f"{SDK}:own_config",
                       "pricing": {"fake-sdk-model": PRICES, "fake-specialist": PRICES}})
    session = make_session(fw_db, agent_id="own-config")
    fw_executors.start()
    run_id = answered(fw_db, session, "go")
    # The specialist's call is counted, but the run cannot tell its model: cost unknown
    # (null), never priced as another model's and never left out.
    assert calls(fw_db, run_id) == sorted([("fake-sdk-model", 10, 1), (None, 10, 6),
                                           ("fake-sdk-model", 30, 6)], key=repr)
    unknown = next(u for u in usages(fw_db, run_id) if u["model"] is None)
    assert unknown["cost_usd"] is None
