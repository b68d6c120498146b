"""A complete OpenAI Agents SDK agent for agentledger: instructions and one function tool.

Register it with ``"kind": "openai-agents", "params": {"agent": "sdk_assistant.agent:assistant"}``
(``examples/`` on ``PYTHONPATH``). agentledger runs it with ``Runner.run_streamed`` and the SDK's
own SQLAlchemy session on the ledger database, so every message of a session continues the same
conversation.

The model below is a small offline stand-in so the example runs without network or API keys.
WHERE A REAL MODEL GOES: replace ``model=OfflineModel()`` with a model name, e.g.
``model="gpt-4.1-mini"`` (and set ``OPENAI_API_KEY`` on the workers).
"""

from __future__ import annotations

import json

from agents import Agent, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails


@function_tool
def get_weather(city: str) -> str:
    """Today's weather in a city."""
    return f"sunny and 21°C in {city}"


def _text(item: dict) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


class OfflineModel(Model):
    """Stand-in model (no network): remembers the conversation it is given, calls
    ``get_weather`` for "weather in <city>", and streams its answer word by word."""

    model = "offline-example"

    def _output(self, items: list) -> list:
        said = [_text(i) for i in items if i.get("role") == "user"]
        last = items[-1]
        if last.get("type") == "function_call_output":
            text = f"It is {last['output']}."
        elif said[-1].lower().startswith("weather in "):
            city = said[-1][len("weather in "):].strip(" ?")
            return [ResponseFunctionToolCall(type="function_call", id=f"fc_{len(items)}",
                                             call_id=f"call_{len(items)}", name="get_weather",
                                             arguments=json.dumps({"city": city}))]
        elif len(said) > 1:
            text = f"Earlier you told me: '{said[0]}'. Now you ask: '{said[-1]}'."
        else:
            text = f"Noted: '{said[-1]}'."
        return [ResponseOutputMessage(type="message", id="msg_offline", role="assistant",
                                      status="completed", content=[ResponseOutputText(
                                          type="output_text", text=text, annotations=[])])]

    def _response(self, items: list, output: list) -> Response:
        tokens_in, tokens_out = 12 * len(items), 20
        return Response(id="resp_offline", created_at=0, model=self.model, object="response",
                        output=output, tool_choice="auto", tools=[], parallel_tool_calls=False,
                        usage=ResponseUsage(
                            input_tokens=tokens_in, output_tokens=tokens_out,
                            total_tokens=tokens_in + tokens_out,
                            input_tokens_details=InputTokensDetails(cached_tokens=0,
                                                                    cache_write_tokens=0),
                            output_tokens_details=OutputTokensDetails(reasoning_tokens=0)))

    @staticmethod
    def _items(input) -> list:
        return [{"role": "user", "content": input}] if isinstance(input, str) else list(input)

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema,
                           handoffs, tracing, **kwargs) -> ModelResponse:
        items = self._items(input)
        response = self._response(items, self._output(items))
        return ModelResponse(output=response.output, response_id=response.id, usage=Usage(
            requests=1, input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens, total_tokens=response.usage.total_tokens))

    async def stream_response(self, system_instructions, input, model_settings, tools,
                              output_schema, handoffs, tracing, **kwargs):
        items = self._items(input)
        response = self._response(items, self._output(items))
        yield ResponseCreatedEvent(type="response.created", response=response, sequence_number=0)
        seq = 0
        for index, item in enumerate(response.output):
            if isinstance(item, ResponseOutputMessage):
                for n, word in enumerate(item.content[0].text.split(" ")):
                    seq += 1
                    yield ResponseTextDeltaEvent(
                        type="response.output_text.delta", item_id=item.id, output_index=index,
                        content_index=0, delta=word if n == 0 else " " + word, logprobs=[],
                        sequence_number=seq)
        yield ResponseCompletedEvent(type="response.completed", response=response,
                                     sequence_number=seq + 1)


assistant = Agent(
    name="Assistant",
    instructions="You answer briefly and use get_weather for weather questions.",
    model=OfflineModel(),  # <- a real model goes here, e.g. model="gpt-4.1-mini"
    tools=[get_weather],
)
