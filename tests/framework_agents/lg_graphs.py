"""LangGraph graphs with a fake chat model that streams chunks, calls a tool and reports usage."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

from agentledger.agent_kinds import current_run

# How many chunks the fake model produced for the "slow" prompt (a cancel stops it).
SLOW_CHUNKS = {"count": 0}
SLOW_LOCK = threading.Lock()


class FakeModel(BaseChatModel):
    """Answers from the conversation it is given (so memory shows), word by word."""

    model_name: str = "fake-model"
    delay: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "agentledger-fake"

    def bind_tools(self, tools, **kwargs):
        return self

    def _reply(self, messages) -> AIMessage:
        humans = [m.text for m in messages if isinstance(m, HumanMessage)]
        last = messages[-1]
        if isinstance(last, ToolMessage):
            return AIMessage(content=f"The weather: {last.text}.")
        text = humans[-1]
        if text.startswith("boom"):
            raise ValueError("the model broke")
        if text.startswith("rant"):  # longer than a run's error holds, with a NUL in it
            raise ValueError("why\x00" + "!" * 100_000)
        if text.startswith("weather in "):
            return AIMessage(content="", tool_calls=[{
                "name": "get_weather", "args": {"city": text[len("weather in "):]},
                "id": f"call_{len(messages)}", "type": "tool_call"}])
        if text.startswith("slow"):
            return AIMessage(content=" ".join(f"w{i}" for i in range(200)))
        if len(humans) > 1:
            return AIMessage(content=f"You first said: {humans[0]}. Now: {text}.")
        return AIMessage(content=f"Hello, you said: {text}.")

    def _usage(self, messages, reply: AIMessage) -> dict:
        return {"input_tokens": 10 * len(messages), "output_tokens": len(reply.text.split()) + 1,
                "total_tokens": 10 * len(messages) + len(reply.text.split()) + 1}

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        reply = self._reply(messages)
        reply.usage_metadata = self._usage(messages, reply)
        reply.response_metadata = {"model_name": self.model_name}
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        reply = self._reply(messages)
        slow = reply.text.startswith("w0 ")
        words = reply.text.split(" ") if reply.text else []
        for i, word in enumerate(words):
            if slow:
                time.sleep(0.05)
                with SLOW_LOCK:
                    SLOW_CHUNKS["count"] += 1
            elif self.delay:
                time.sleep(self.delay)
            chunk = ChatGenerationChunk(message=AIMessageChunk(
                content=word if i == 0 else " " + word))
            if run_manager:
                run_manager.on_llm_new_token(chunk.message.content, chunk=chunk)
            yield chunk
        yield ChatGenerationChunk(message=AIMessageChunk(
            content="", tool_call_chunks=[
                {"name": c["name"], "args": __import__("json").dumps(c["args"]), "id": c["id"],
                 "index": n} for n, c in enumerate(reply.tool_calls)],
            usage_metadata=self._usage(messages, reply),
            response_metadata={"model_name": self.model_name}, chunk_position="last"))


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


MODEL = FakeModel()  # a real graph puts its chat model here (e.g. ChatOpenAI(model=...))


def call_model(state: MessagesState) -> dict[str, Any]:
    return {"messages": [MODEL.bind_tools([get_weather]).invoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("model", call_model)
builder.add_node("tools", ToolNode([get_weather]))
builder.add_edge(START, "model")
builder.add_conditional_edges("model", tools_condition)
builder.add_edge("tools", "model")

# ``params.graph = "framework_agents.lg_graphs:builder"``: a StateGraph, compiled by agentledger.
graph = builder


def build(checkpointer):
    """``params.graph = "framework_agents.lg_graphs:build"``: a factory given the checkpointer."""
    return builder.compile(checkpointer=checkpointer, name="weather-graph")


compiled = builder.compile()  # the wrong kind of object for params.graph
not_a_graph = 42


# ---- a graph that asks the user before answering (interrupt / resume) ---------------------

def ask_city(state: MessagesState) -> dict[str, Any]:
    city = interrupt(f"Which city, for '{state['messages'][-1].text}'?")
    return {"messages": [AIMessage(content=f"Booked a trip to {city}.")]}


asking = StateGraph(MessagesState)
asking.add_node("ask", ask_city)
asking.add_edge(START, "ask")
asking.add_edge("ask", END)


# ---- a graph whose node delegates to other agents ----------------------------------------

def delegate_node(state: MessagesState) -> dict[str, Any]:
    text = state["messages"][-1].text
    children = current_run().delegate([{"agent_id": "helper", "input": f"part {n} of {text}"}
                                       for n in (1, 2)])
    done = ", ".join(c["status"] for c in children)
    return {"messages": [AIMessage(content=f"children: {done}")]}


delegating = StateGraph(MessagesState)
delegating.add_node("delegate", delegate_node)
delegating.add_edge(START, "delegate")
delegating.add_edge("delegate", END)


# ---- a graph whose model call hangs mid-answer (a worker killed while the graph runs) -------

STALL_SECONDS = 600.0


class StallingModel(FakeModel):
    """Like ``FakeModel``, but for a prompt starting "stall" streams one chunk and then hangs in
    the middle of the model call, as a slow provider would: the graph is visibly mid-flight.
    Its answers name every earlier question and how many got an answer, so the whole memory of
    the thread shows."""

    def _reply(self, messages) -> AIMessage:
        humans = [m.text for m in messages if isinstance(m, HumanMessage)]
        if len(humans) < 2:
            return super()._reply(messages)
        answered = sum(isinstance(m, AIMessage) for m in messages)
        return AIMessage(content=f"Earlier: {' | '.join(humans[:-1])} ({answered} answered). "
                                 f"Now: {humans[-1]}.")

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        humans = [m.text for m in messages if isinstance(m, HumanMessage)]
        if humans and humans[-1].startswith("stall"):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content="thinking"))
            if run_manager:
                run_manager.on_llm_new_token(chunk.message.content, chunk=chunk)
            yield chunk
            time.sleep(STALL_SECONDS)
        yield from super()._stream(messages, stop=stop, run_manager=run_manager, **kwargs)


STALLING_MODEL = StallingModel()


def call_stalling_model(state: MessagesState) -> dict[str, Any]:
    return {"messages": [STALLING_MODEL.invoke(state["messages"])]}


stalling = StateGraph(MessagesState)
stalling.add_node("model", call_stalling_model)
stalling.add_edge(START, "model")
stalling.add_edge("model", END)


# ---- the model-and-tool graph as a node of a parent graph: a subgraph, one and two deep -----

def _around(node) -> StateGraph:
    """A parent graph whose one node is ``node`` (a compiled graph: LangGraph runs it as a
    subgraph, with the parent's checkpointer)."""
    parent = StateGraph(MessagesState)
    parent.add_node("assistant", node)
    parent.add_edge(START, "assistant")
    parent.add_edge("assistant", END)
    return parent


with_subgraph = _around(builder.compile(name="weather"))
with_nested_subgraph = _around(_around(builder.compile(name="weather")).compile(name="team"))


# ---- a graph with a node busy in plain Python (no model, no callback, nothing to interrupt) --

PLOD_STEPS = 50
PLOD: dict[str, Any] = {"steps": 0, "finished": False, "answered": []}


def plod(state: MessagesState) -> dict[str, Any]:
    if not state["messages"][-1].text.startswith("plod"):
        return {}
    for _ in range(PLOD_STEPS):
        time.sleep(0.1)
        PLOD["steps"] += 1
    PLOD["finished"] = True
    return {"messages": [AIMessage(content="plodded all the way")]}


def answer(state: MessagesState) -> dict[str, Any]:
    """Names every earlier question and how many got an answer: the thread's whole memory."""
    humans = [m.text for m in state["messages"] if isinstance(m, HumanMessage)]
    PLOD["answered"].append(humans[-1])
    answered = sum(isinstance(m, AIMessage) for m in state["messages"])
    return {"messages": [AIMessage(content=f"Earlier: {' | '.join(humans[:-1]) or 'nothing'} "
                                           f"({answered} answered). Now: {humans[-1]}.")]}


plodding = StateGraph(MessagesState)
plodding.add_node("plod", plod)
plodding.add_node("answer", answer)
plodding.add_edge(START, "plod")
plodding.add_edge("plod", "answer")
plodding.add_edge("answer", END)


# ---- a graph whose state holds a value of the graph's own type -----------------------------


@dataclasses.dataclass
class Note:
    """LangGraph's serializer keeps it as its module and class name and fields; a ledger server
    rebuilds it from an executor only when ``AGENTLEDGER_CHECKPOINT_TYPES`` names it."""

    text: str


class NotedState(MessagesState):
    note: Note


def take_note(state: NotedState) -> dict[str, Any]:
    text = state["messages"][-1].text
    return {"messages": [AIMessage(content=f"Noted: {text}.")], "note": Note(text)}


noting = StateGraph(NotedState)
noting.add_node("note", take_note)
noting.add_edge(START, "note")
noting.add_edge("note", END)
