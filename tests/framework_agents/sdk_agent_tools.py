"""Agents SDK agents that call other agents as tools (``Agent.as_tool``), at two depths and in
parallel, and an agent whose tool exits the interpreter: all with fake models, no network."""

from __future__ import annotations

from typing import Any

from agents import Agent, RunConfig, function_tool

from framework_agents.sdk_agents import FakeSdkModel, _text_of, specialist


class CallsTools(FakeSdkModel):
    """First calls each of ``tools`` (in one response, so the SDK runs them in parallel) with
    the user's text; once their outputs are in, answers with them."""

    def __init__(self, model: str, tools: list[str]):
        super().__init__(model=model)
        self.tools = tools

    def _output(self, items: list[dict], handoffs) -> list:
        last_user = max(i for i, item in enumerate(items) if item.get("role") == "user")
        text = _text_of(items[last_user])
        outputs = [str(item["output"]) for item in items[last_user + 1:]
                   if item.get("type") == "function_call_output"]
        if outputs:
            return [self._message(" | ".join(sorted(outputs)))]
        return [self._call(name, {"input": f"{name}: {text}"}, 10 * len(items) + n)
                for n, name in enumerate(self.tools)]


researcher = Agent(name="Researcher", instructions="Research it.",
                   model=FakeSdkModel(model="fake-researcher", persona="Researcher"))
lead = Agent(name="Lead", instructions="Ask the researcher.",
             model=CallsTools("fake-lead", ["ask_researcher"]),
             tools=[researcher.as_tool(tool_name="ask_researcher",
                                       tool_description="Ask the researcher.")])
# The outer agent calls the specialist and the lead (who calls the researcher) in parallel.
manager = Agent(name="Manager", instructions="Ask your team.",
                model=CallsTools("fake-sdk-model", ["ask_specialist", "ask_lead"]),
                tools=[specialist.as_tool(tool_name="ask_specialist",
                                          tool_description="Ask the specialist."),
                       lead.as_tool(tool_name="ask_lead", tool_description="Ask the lead.")])

# An agent tool given a RunConfig of its own (not the run's): its responses are still counted.
own_config = Agent(name="OwnConfig", instructions="Ask the specialist.",
                   model=CallsTools("fake-sdk-model", ["ask_specialist"]),
                   tools=[specialist.as_tool(tool_name="ask_specialist",
                                             tool_description="Ask the specialist.",
                                             run_config=RunConfig(tracing_disabled=True))])


@function_tool
def leave(how: str) -> str:
    """Leave the way it is told to."""
    if how == "exit":
        raise SystemExit(3)
    if how == "interrupt":
        raise KeyboardInterrupt("pressed")
    return f"still here: {how}"


class CallsLeave(FakeSdkModel):
    def _output(self, items: list[dict], handoffs) -> list[Any]:
        last = items[-1]
        if last.get("type") == "function_call_output":
            return [self._message(f"The tool said: {last['output']}.")]
        users = [_text_of(i) for i in items if i.get("role") == "user"]
        return [self._call("leave", {"how": users[-1]}, len(items))]


leaver = Agent(name="Leaver", instructions="Leave.", model=CallsLeave(), tools=[leave])
