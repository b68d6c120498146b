"""LangGraph graphs with ``async def`` parts, which kind ``langgraph`` cannot run (it drives a
graph with the sync ``graph.stream`` and LangGraph's sync savers), and their plain-Python sync
twin, which it runs. No model, no network: ``params.graph = "support.async_graphs:<name>"``."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode


def a(state: MessagesState) -> dict[str, Any]:
    return {"messages": [AIMessage(content=f"a saw: {state['messages'][-1].text}", id="a")]}


def b(state: MessagesState) -> dict[str, Any]:
    return {"messages": [AIMessage(content=f"b saw: {state['messages'][-1].text}")]}


async def async_b(state: MessagesState) -> dict[str, Any]:
    return b(state)


async def route(state: MessagesState) -> str:
    return END


@tool
async def lookup(query: str) -> str:
    """Looks ``query`` up."""
    return query


def ask_lookup(state: MessagesState) -> dict[str, Any]:
    call = {"name": "lookup", "args": {"query": state["messages"][-1].text}, "id": "call-1"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


def _two_nodes(second) -> StateGraph:
    graph = StateGraph(MessagesState)
    graph.add_node("a", a)
    graph.add_node("b", second)
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", END)
    return graph


plain = _two_nodes(b)  # the sync twin: runs
with_async_node = _two_nodes(async_b)

with_async_edge = StateGraph(MessagesState)
with_async_edge.add_node("a", a)
with_async_edge.add_edge(START, "a")
with_async_edge.add_conditional_edges("a", route)

with_async_tool = StateGraph(MessagesState)
with_async_tool.add_node("a", ask_lookup)
with_async_tool.add_node("tools", ToolNode([lookup]))
with_async_tool.add_edge(START, "a")
with_async_tool.add_edge("a", "tools")
with_async_tool.add_edge("tools", END)

with_async_subgraph = StateGraph(MessagesState)
with_async_subgraph.add_node("team", with_async_node.compile(name="team"))
with_async_subgraph.add_edge(START, "team")
with_async_subgraph.add_edge("team", END)


def build_async(checkpointer):
    """A factory: registration cannot see its graph, the run does."""
    return with_async_node.compile(checkpointer=checkpointer)
