"""A complete LangGraph agent for agentledger: one model node and one tool.

Register it with ``"kind": "langgraph", "params": {"graph": "langgraph_weather.agent:graph"}``
(``examples/`` on ``PYTHONPATH``). agentledger compiles ``graph`` with LangGraph's own
checkpointer on the ledger database, so every message of a session continues the same thread.

The model below is a small offline stand-in so the example runs without network or API keys.
WHERE A REAL MODEL GOES: replace ``MODEL = OfflineModel()`` with a real chat model, e.g.
``from langchain_openai import ChatOpenAI; MODEL = ChatOpenAI(model="gpt-4.1-mini")``.
"""

from __future__ import annotations

import json

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


@tool
def get_weather(city: str) -> str:
    """Today's weather in a city."""
    return f"sunny and 21°C in {city}"


class OfflineModel(BaseChatModel):
    """Stand-in chat model (no network): remembers the conversation it is given, calls
    ``get_weather`` for "weather in <city>", and streams its answer word by word."""

    @property
    def _llm_type(self) -> str:
        return "offline-example"

    def bind_tools(self, tools, **kwargs):
        return self

    def _reply(self, messages) -> AIMessage:
        said = [m.text for m in messages if isinstance(m, HumanMessage)]
        if isinstance(messages[-1], ToolMessage):
            text = f"It is {messages[-1].text}."
        elif said[-1].lower().startswith("weather in "):
            city = said[-1][len("weather in "):].strip(" ?")
            return AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {"city": city},
                                                      "id": f"call_{len(messages)}"}])
        elif len(said) > 1:
            text = f"Earlier you told me: '{said[0]}'. Now you ask: '{said[-1]}'."
        else:
            text = f"Noted: '{said[-1]}'."
        return AIMessage(content=text)

    def _usage(self, messages, reply) -> dict:
        tokens_in, tokens_out = 12 * len(messages), len(reply.text.split()) + 1
        return {"input_tokens": tokens_in, "output_tokens": tokens_out,
                "total_tokens": tokens_in + tokens_out}

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        reply = self._reply(messages)
        reply.usage_metadata = self._usage(messages, reply)
        reply.response_metadata = {"model_name": "offline-example"}
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        reply = self._reply(messages)
        for n, word in enumerate(reply.text.split(" ") if reply.text else []):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word if n == 0 else " " + word))
            if run_manager:
                run_manager.on_llm_new_token(chunk.message.content, chunk=chunk)
            yield chunk
        yield ChatGenerationChunk(message=AIMessageChunk(
            content="", usage_metadata=self._usage(messages, reply),
            response_metadata={"model_name": "offline-example"},
            tool_call_chunks=[{"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"],
                               "index": i} for i, c in enumerate(reply.tool_calls)]))


MODEL = OfflineModel()  # <- a real chat model goes here


def call_model(state: MessagesState) -> dict:
    return {"messages": [MODEL.bind_tools([get_weather]).invoke(state["messages"])]}


graph = StateGraph(MessagesState)
graph.add_node("model", call_model)
graph.add_node("tools", ToolNode([get_weather]))
graph.add_edge(START, "model")
graph.add_conditional_edges("model", tools_condition)
graph.add_edge("tools", "model")
