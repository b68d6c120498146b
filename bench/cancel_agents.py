"""The agents ``python -m bench.cancel`` cancels: each starts answering and would go on for
minutes. Imported by the measured server's executor (``params.graph``)."""

from __future__ import annotations

import itertools
import time

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph

TOKEN_SECONDS = 0.05  # a model that streams 20 tokens a second
TOKENS = 12_000  # ten minutes of them


class SlowModel(GenericFakeChatModel):
    """LangChain's own fake chat model, streaming its tokens at a model's pace."""

    def _stream(self, *args, **kwargs):
        for chunk in super()._stream(*args, **kwargs):
            time.sleep(TOKEN_SECONDS)
            yield chunk


_model = SlowModel(messages=itertools.repeat(AIMessage(content=" ".join(["word"] * TOKENS))))


def _answer(state: MessagesState) -> dict:
    return {"messages": [_model.invoke(state["messages"])]}


graph = StateGraph(MessagesState).add_node("answer", _answer).add_edge(START, "answer")


def _sdk_agent():
    """An Agents SDK agent whose model (an SDK ``Model``) streams a word every
    ``TOKEN_SECONDS``; None when the SDK is not installed."""
    try:
        from agents import Agent
        from agents.models.interface import Model
        from openai.types.responses import (
            Response,
            ResponseCreatedEvent,
            ResponseOutputItemAddedEvent,
            ResponseOutputMessage,
            ResponseOutputText,
            ResponseTextDeltaEvent,
        )
    except ImportError:
        return None
    import asyncio

    class SlowSdkModel(Model):
        async def get_response(self, *args, **kwargs):
            raise NotImplementedError("the bench streams")

        async def stream_response(self, *args, **kwargs):
            message = ResponseOutputMessage(
                id="msg_slow", type="message", role="assistant", status="in_progress",
                content=[ResponseOutputText(type="output_text", text="", annotations=[])])
            yield ResponseCreatedEvent(type="response.created", sequence_number=0, response=Response(
                id="resp_slow", created_at=0, model="slow", object="response", output=[],
                tool_choice="auto", tools=[], top_p=None, parallel_tool_calls=False))
            yield ResponseOutputItemAddedEvent(type="response.output_item.added", item=message,
                                               output_index=0, sequence_number=1)
            for seq in range(2, TOKENS + 2):
                await asyncio.sleep(TOKEN_SECONDS)
                yield ResponseTextDeltaEvent(
                    type="response.output_text.delta", item_id=message.id, output_index=0,
                    content_index=0, delta="word ", logprobs=[], sequence_number=seq)

    return Agent(name="Slow", instructions="Go on.", model=SlowSdkModel())


agent = _sdk_agent()
