"""LangGraph graphs whose model calls do not all end up in ``messages`` (a classifier, a router,
a summariser), whose nodes interrupt in parallel, and whose nodes exit the interpreter."""

from __future__ import annotations

import operator
from typing import Annotated, Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt

from framework_agents.lg_graphs import FakeModel


class SaysModel(FakeModel):
    """A fake chat model that always answers ``text`` (streamed word by word, with usage)."""

    text: str = "ok"

    def _reply(self, messages) -> AIMessage:
        return AIMessage(content=self.text)


# Each model its own name, so that each call's usage event says which one it was.
CLASSIFIER = SaysModel(model_name="fake-classifier", text="label: travel")
ROUTER = SaysModel(model_name="fake-router", text="route: answer")
SUMMARISER = SaysModel(model_name="fake-summariser", text="a short summary of it")
ANSWERER = FakeModel(model_name="fake-model")
LEFT = SaysModel(model_name="fake-left", text="left side")
RIGHT = SaysModel(model_name="fake-right", text="right side")


class SideState(MessagesState):
    label: str
    summary: str
    notes: Annotated[list[str], operator.add]


def _question(state) -> list[HumanMessage]:
    return [HumanMessage(content=state["messages"][-1].text)]


def classify(state: SideState) -> dict[str, Any]:
    """Consults a model; its reply goes to ``label``, not to ``messages``."""
    return {"label": CLASSIFIER.invoke(_question(state)).text}


def route(state: SideState) -> str:
    """A conditional edge that asks a model where to go (its reply is never stored)."""
    ROUTER.invoke(_question(state))
    return "answer"


def answer(state: SideState) -> dict[str, Any]:
    return {"messages": [ANSWERER.invoke(state["messages"])]}


def summarise(state: SideState) -> dict[str, Any]:
    """Streams a model's reply into ``summary``."""
    text = "".join(chunk.text for chunk in SUMMARISER.stream(_question(state)))
    return {"summary": text}


side_calls = StateGraph(SideState)
side_calls.add_node("classify", classify)
side_calls.add_node("answer", answer)
side_calls.add_node("summarise", summarise)
side_calls.add_edge(START, "classify")
side_calls.add_conditional_edges("classify", route, ["answer"])
side_calls.add_edge("answer", "summarise")
side_calls.add_edge("summarise", END)


def left(state: SideState) -> dict[str, Any]:
    return {"notes": [LEFT.invoke(_question(state)).text]}


def right(state: SideState) -> dict[str, Any]:
    return {"notes": [RIGHT.invoke(_question(state)).text]}


def join(state: SideState) -> dict[str, Any]:
    return {"messages": [AIMessage(content=" + ".join(sorted(state["notes"][-2:])))]}


def fan_out_and_in(state: type, first, second, then) -> StateGraph:
    """``first`` and ``second`` in one step (LangGraph runs them in threads), then ``then``."""
    graph = StateGraph(state)
    for node in (first, second, then):
        graph.add_node(node.__name__, node)
    for node in (first, second):
        graph.add_edge(START, node.__name__)
        graph.add_edge(node.__name__, then.__name__)
    graph.add_edge(then.__name__, END)
    return graph


# Two nodes of one step consult a model at the same time.
parallel_calls = fan_out_and_in(SideState, left, right, join)


# ---- two nodes of one step interrupt (LangGraph then has two pending interrupts) ------------

def ask_dates(state: MessagesState) -> dict[str, Any]:
    dates = interrupt("Which dates?")
    return {"messages": [AIMessage(content=f"dates: {dates}")]}


def ask_budget(state: MessagesState) -> dict[str, Any]:
    budget = interrupt({"question": "Which budget?", "currency": "EUR"})
    return {"messages": [AIMessage(content=f"budget: {budget}")]}


def plan(state: MessagesState) -> dict[str, Any]:
    answers = sorted(m.text for m in state["messages"][-2:] if isinstance(m, AIMessage))
    return {"messages": [AIMessage(content="Plan with " + " and ".join(answers) + ".")]}


parallel_asking = fan_out_and_in(MessagesState, ask_dates, ask_budget, plan)


# ---- a node that exits the interpreter (``sys.exit()``) or raises KeyboardInterrupt --------

def leave(state: MessagesState) -> dict[str, Any]:
    text = state["messages"][-1].text
    if text == "exit":
        raise SystemExit(3)
    if text == "interrupt":
        raise KeyboardInterrupt("pressed")
    return {"messages": [AIMessage(content=f"still here: {text}")]}


exiting = StateGraph(MessagesState)
exiting.add_node("leave", leave)
exiting.add_edge(START, "leave")
exiting.add_edge("leave", END)
