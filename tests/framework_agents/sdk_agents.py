"""Agents SDK agents with a fake model (an ``agents.models.interface.Model``) that streams text
deltas, calls a function tool, hands off and reports usage: no network."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from agents import Agent, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from agentledger.agent_kinds import current_run

SLOW_DELTAS = {"count": 0}
_LOCK = threading.Lock()


def _text_of(item: Any) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


class FakeSdkModel(Model):
    """Answers from the items it is given (the session's history plus the new input)."""

    def __init__(self, model: str = "fake-sdk-model", persona: str = ""):
        self.model = model
        self.persona = persona

    def _output(self, items: list[dict], handoffs) -> list:
        users = [_text_of(i) for i in items if i.get("role") == "user"]
        last = items[-1]
        text = users[-1]
        if self.persona:
            return [self._message(f"{self.persona} here, about: {text}.")]
        if last.get("type") == "function_call_output":
            return [self._message(f"The result: {last['output']}.")]
        if text.startswith("boom"):
            raise ValueError("the model broke")
        if text.startswith("weather in "):
            return [self._call("get_weather", {"city": text[len("weather in "):]}, len(items))]
        if text.startswith("delegate"):
            return [self._call("ask_helpers", {"task": text}, len(items))]
        if text.startswith("transfer") and handoffs:
            return [self._call(handoffs[0].tool_name, {}, len(items))]
        if text.startswith("plod"):
            return [self._call("plod", {"task": text}, len(items))]
        if text.startswith("slow"):
            return [self._message(" ".join(f"w{i}" for i in range(200)))]
        if len(users) > 1:
            return [self._message(f"You first said: {users[0]}. Now: {text}.")]
        return [self._message(f"Hello, you said: {text}.")]

    @staticmethod
    def _message(text: str) -> ResponseOutputMessage:
        return ResponseOutputMessage(id="msg_fake", type="message", role="assistant", status="completed",
                                     content=[ResponseOutputText(type="output_text", text=text,
                                                                 annotations=[])])

    @staticmethod
    def _call(name: str, args: dict, n: int) -> ResponseFunctionToolCall:
        return ResponseFunctionToolCall(id=f"fc_{n}", call_id=f"call_{n}", type="function_call",
                                        name=name, arguments=json.dumps(args), status="completed")

    def _response(self, items, output) -> Response:
        words = sum(len(o.content[0].text.split()) for o in output
                    if isinstance(o, ResponseOutputMessage))
        return Response(
            id="resp_fake", created_at=0, model=self.model, object="response", output=output,
            tool_choice="auto", tools=[], top_p=None, parallel_tool_calls=False,
            usage=ResponseUsage(input_tokens=10 * len(items), output_tokens=words + 1,
                                total_tokens=10 * len(items) + words + 1,
                                input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
                                output_tokens_details=OutputTokensDetails(reasoning_tokens=0)))

    @staticmethod
    def _items(input) -> list[dict]:
        return [{"role": "user", "content": input}] if isinstance(input, str) else list(input)

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema,
                           handoffs, tracing, *, previous_response_id=None, conversation_id=None,
                           prompt=None) -> ModelResponse:
        items = self._items(input)
        output = self._output(items, handoffs)
        response = self._response(items, output)
        return ModelResponse(output=output, usage=Usage(
            requests=1, input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens, total_tokens=response.usage.total_tokens),
            response_id=response.id)

    async def stream_response(self, system_instructions, input, model_settings, tools,
                              output_schema, handoffs, tracing, *, previous_response_id=None,
                              conversation_id=None, prompt=None) -> AsyncIterator:
        items = self._items(input)
        output = self._output(items, handoffs)
        response = self._response(items, output)
        seq = 0
        yield ResponseCreatedEvent(type="response.created", response=response, sequence_number=seq)
        for index, item in enumerate(output):
            seq += 1
            yield ResponseOutputItemAddedEvent(type="response.output_item.added", item=item,
                                               output_index=index, sequence_number=seq)
            if isinstance(item, ResponseOutputMessage):
                text = item.content[0].text
                slow = text.startswith("w0 ")
                for n, word in enumerate(text.split(" ")):
                    if slow:
                        await asyncio.sleep(0.05)
                        with _LOCK:
                            SLOW_DELTAS["count"] += 1
                    seq += 1
                    yield ResponseTextDeltaEvent(
                        type="response.output_text.delta", item_id=item.id, output_index=index,
                        content_index=0, delta=word if n == 0 else " " + word, logprobs=[],
                        sequence_number=seq)
            seq += 1
            yield ResponseOutputItemDoneEvent(type="response.output_item.done", item=item,
                                              output_index=index, sequence_number=seq)
        seq += 1
        yield ResponseCompletedEvent(type="response.completed", response=response,
                                     sequence_number=seq)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@function_tool
def ask_helpers(task: str) -> str:
    """Delegate the task to two helper agents (real child runs of this run)."""
    children = current_run().delegate([{"agent_id": "helper", "input": f"part {n} of {task}"}
                                       for n in (1, 2)])
    return ", ".join(c["status"] for c in children)


PLOD_STEPS = 50
PLOD: dict[str, Any] = {"steps": 0, "finished_at": None}


@function_tool
def plod(task: str) -> str:
    """Work at the task in plain Python (nothing in it a cancel can interrupt)."""
    for _ in range(PLOD_STEPS):
        time.sleep(0.1)
        PLOD["steps"] += 1
    PLOD["finished_at"] = datetime.now(UTC)
    return f"plodded through {task}"


# A real agent names its model here (e.g. model="gpt-4.1"); the tests use the fake one.
assistant = Agent(name="Assistant", instructions="Answer briefly.", model=FakeSdkModel(),
                  tools=[get_weather, ask_helpers])

specialist = Agent(name="Specialist", instructions="You are the specialist.",
                   model=FakeSdkModel(model="fake-specialist", persona="Specialist"))
triage = Agent(name="Triage", instructions="Hand off to the specialist.", model=FakeSdkModel(),
               handoffs=[specialist])


def make_assistant() -> Agent:
    """``params.agent = "framework_agents.sdk_agents:make_assistant"``: a factory."""
    return assistant.clone(name="Assistant (factory)")


plodder = Agent(name="Plodder", instructions="Work at it.", model=FakeSdkModel(), tools=[plod])

not_an_agent = "just a string"
