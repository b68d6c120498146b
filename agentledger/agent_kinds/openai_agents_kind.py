"""Kind ``openai-agents``: runs an OpenAI Agents SDK agent on the run's thread (CONTRACT §7).

``params.agent`` is ``"package.module:attr"``: an ``agents.Agent`` or a callable returning one.
The run executes ``Runner.run_streamed(agent, input, session=...)`` where the session is the
SDK's own ``SQLAlchemySession`` on the ledger's database, keyed by the run's thread (for an
executor without database access, ``remote_session`` asks the ledger server to use that same
session), so the conversation continues across runs, processes, restarts and kinds of worker.
The SDK is imported only when such an agent is registered or run.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

from agentledger.agent_kinds import code_agents
from agentledger.agent_kinds.code_agents import Unavailable
from agentledger.agent_kinds.framework_thread import CANCEL_POLL, WriteFence, run_in_own_thread
from agentledger.agent_kinds.run_context import AGENT_RAISES, AgentFailed, RunCancelled, RunContext
from agentledger.agent_kinds.storage import openai_agents_installed

EXTRA = "pip install 'agentledger[openai-agents]'"
# The session's methods that change the thread's conversation.
SESSION_WRITES = ("add_items", "pop_item", "clear_session")


def _check_object(obj: Any, where: str) -> None:
    from agents import Agent

    if isinstance(obj, Agent):
        return
    if not callable(obj) or isinstance(obj, type):
        raise Unavailable(f"{where} names a {type(obj).__name__}, not an Agents SDK Agent or a "
                          "callable returning one")


def validate(params: dict[str, Any]) -> None:
    """Registration check: a sentence (``ValueError``) when ``params.agent`` cannot run."""
    code_agents.parse_reference(params.get("agent"), "params.agent")
    if not openai_agents_installed():
        return  # this server can't import it; the workers that run it will tell
    obj, _, _ = code_agents.load_reference(params["agent"], "params.agent")
    _check_object(obj, "params.agent")


def _agent(obj: Any, where: str):
    from agents import Agent

    _check_object(obj, where)
    agent = obj if isinstance(obj, Agent) else obj()
    if not isinstance(agent, Agent):
        raise Unavailable(f"{where} returned a {type(agent).__name__}, not an Agents SDK Agent")
    return agent


def _model_name(model: Any) -> str | None:
    if model is None or isinstance(model, str):
        return model or None
    return getattr(model, "model", None) or getattr(model, "model_name", None) or type(model).__name__


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return code_agents.as_json(raw)


# The agent whose model call is under way in this asyncio task: set by the run's
# ``call_model_input_filter`` just before the call, taken when the call's usage is counted.
_CALLING: ContextVar[Any] = ContextVar("agentledger_sdk_calling_agent", default=None)


def _usage_model(agent: Any) -> str | None:
    """The name of the model the SDK calls for ``agent`` (the run sets no ``RunConfig.model``):
    its ``model`` as configured (a name, or the model object's ``model``), the SDK's default
    model when it names none; ``None`` when it cannot be told."""
    if agent is None:
        return None
    model = getattr(agent, "model", None)
    if model is None:
        from agents.models import get_default_model

        return get_default_model()
    if isinstance(model, str):
        return model or None
    name = getattr(model, "model", None) or getattr(model, "model_name", None)
    return name if isinstance(name, str) and name else None


@lru_cache(maxsize=1)
def _counting_usage_type() -> type:
    from agents.usage import Usage

    class CountingUsage(Usage):
        """The run's ``RunContextWrapper.usage``: the SDK adds each model response's usage to
        it, and shares it with every agent the run calls as a tool (``Agent.as_tool``), so
        their responses are added to it too. Each addition is also handed to the run's
        ``_ModelUsage``."""

        def add(self, other: Any) -> None:
            super().add(other)
            counter = self.__dict__.get("_agentledger_counter")
            if counter is not None:
                counter.counted(other)

        def __deepcopy__(self, memo: dict) -> Any:
            # The SDK copies a run's usage into a ``RunState`` snapshot: a plain ``Usage``,
            # which counts nothing more.
            return Usage(**{f.name: copy.deepcopy(getattr(self, f.name), memo)
                            for f in dataclasses.fields(Usage)})

    return CountingUsage


class _ModelUsage:
    """One ``usage`` per model response of the run, from the SDK's own usage accounting: the
    responses of the run's agents (handoffs included) and of every agent run as a tool inside
    it, at any depth, each once, when the SDK counts it (right after the response, before its
    tools run). ``model`` is the model of the agent that made the call, named by the run's
    ``call_model_input_filter``, which the SDK calls just before each model call of the run
    and of the agents it runs as tools (they inherit the run's ``RunConfig``; an agent tool
    given a ``run_config`` of its own records its responses with ``model: null``, cost
    unknown). A response that reports no tokens records nothing.

    Writes are not raised inside the SDK (an agent tool would turn the error into a tool
    result and go on): the first failed write is raised by the run's stream loop."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.error: Exception | None = None

    def context(self) -> Any:
        """The ``RunContextWrapper`` the run is started with (no user context, as before)."""
        from agents import RunContextWrapper

        usage = _counting_usage_type()()
        usage._agentledger_counter = self
        return RunContextWrapper(context=None, usage=usage)

    def name_the_caller(self, data: Any) -> Any:
        """``RunConfig.call_model_input_filter``: notes the calling agent, changes nothing."""
        _CALLING.set(data.agent)
        return data.model_data

    def counted(self, usage: Any) -> None:
        agent = _CALLING.get()
        _CALLING.set(None)  # an agent tool's run without the filter must not inherit it
        tokens_in, tokens_out = usage.input_tokens or 0, usage.output_tokens or 0
        if not (tokens_in or tokens_out):
            return
        try:
            code_agents.usage_event(self.ctx, _usage_model(agent), tokens_in, tokens_out)
        except Exception as exc:  # noqa: BLE001 - raised by the stream loop (``raise_failed``)
            if self.error is None:
                self.error = exc

    def raise_failed(self) -> None:
        if self.error is not None:
            raise self.error


class _Reporter:
    """Turns the SDK's stream events into ledger events (usage: ``_ModelUsage``)."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.tool_names: dict[str, str] = {}

    def __call__(self, event: Any) -> None:
        ctx = self.ctx
        if event.type == "raw_response_event":
            data = event.data
            if data.type == "response.output_text.delta" and data.delta:
                ctx.say(data.delta)
        elif event.type == "run_item_stream_event":
            item = event.item
            raw: Any = getattr(item, "raw_item", None)
            if event.name == "tool_called" and getattr(raw, "type", None) == "function_call":
                self.tool_names[raw.call_id] = raw.name
                ctx.emit("tool.call", {"name": raw.name, "input": _arguments(raw.arguments),
                                       "call_id": raw.call_id})
            elif event.name == "tool_output":
                call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
                if call_id in self.tool_names:
                    ctx.emit("tool.result", {"name": self.tool_names[call_id],
                                             "output": code_agents.as_json(item.output),
                                             "call_id": call_id})
            elif event.name in ("handoff_occured", "handoff_occurred"):
                ctx.emit("agent.handoff", {"from_agent": item.source_agent.name,
                                           "to_agent": item.target_agent.name})


async def _watch_cancel(ctx: RunContext, result) -> None:
    while True:
        await asyncio.sleep(CANCEL_POLL)
        if ctx.cancel_requested():
            result.cancel()
            return


def _session(ctx: RunContext) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """The thread's session and what closes it: the SDK's own ``SQLAlchemySession`` on the
    ledger database, or, for an executor without database access, the session that asks the
    ledger server to use that same session there."""
    if ctx.storage is not None:
        from agentledger.agent_kinds.shared_session import SharedEngineSession

        shared = SharedEngineSession(ctx.storage.sessions, ctx.thread_id)
        return shared, shared.close
    from agentledger.agent_kinds.remote_session import RemoteSession

    assert ctx.memory is not None
    remote = RemoteSession(ctx.memory, ctx.thread_id)
    return remote, remote.close


async def _run(ctx: RunContext, agent, module_name: str, attr: str,
               fence: WriteFence) -> str | None:
    from agents import RunConfig, Runner

    session, close = _session(ctx)
    fence.guard(session, *SESSION_WRITES)
    watcher = None
    try:
        ctx.emit("agent.resolved", code_agents.resolved(
            name=agent.name, model=_model_name(agent.model) or ctx.agent_execution_snapshot.get("model"),
            instructions=agent.instructions if isinstance(agent.instructions, str) else None,
            tools=[t.name for t in agent.tools], module_name=module_name, attr=attr,
            session_items=len(await session.get_items())))
        ctx.check_cancel()
        usage = _ModelUsage(ctx)
        result = Runner.run_streamed(
            agent, ctx.input, session=session, context=usage.context(),
            run_config=RunConfig(tracing_disabled=not ctx.params.get("sdk_tracing", False),
                                 call_model_input_filter=usage.name_the_caller))
        watcher = asyncio.create_task(_watch_cancel(ctx, result))
        report = _Reporter(ctx)
        async for event in result.stream_events():
            ctx.check_cancel()
            usage.raise_failed()
            report(event)
        ctx.check_cancel()
        usage.raise_failed()
        output = result.final_output
        return None if output is None else code_agents.as_text(
            output.model_dump(mode="json") if hasattr(output, "model_dump") else output)
    finally:
        if watcher is not None:
            watcher.cancel()
        await close()


def run_openai_agent(ctx: RunContext) -> str | None:
    if not openai_agents_installed():
        raise AgentFailed(f"kind openai-agents needs the openai-agents extra on this worker ({EXTRA})",
                          code="agent_unavailable")
    if ctx.storage is None and ctx.memory is None:
        raise AgentFailed("kind openai-agents keeps its sessions in the ledger database; this "
                          "executor has neither database access nor a ledger server to keep "
                          "them", code="agent_unavailable")
    try:
        obj, module_name, attr = code_agents.load_reference(ctx.params.get("agent"), "params.agent")
        agent = _agent(obj, "params.agent")
    except Unavailable as exc:
        raise code_agents.unavailable(exc) from None
    except AGENT_RAISES as exc:
        if code_agents.is_ledger_signal(exc):
            raise
        raise code_agents.agent_error(exc) from exc
    # In a thread of its own (``framework_thread``): a sync function tool runs in the event
    # loop's executor and ``asyncio.run`` waits for it at the end, and a blocking async tool
    # holds the loop itself, so neither lets this thread end the run on a cancel. The watcher
    # above still stops the SDK itself at its next step.
    fence = WriteFence()
    try:
        return run_in_own_thread(
            ctx, lambda: asyncio.run(_run(ctx, agent, module_name, attr, fence)),
            fence=fence, name="openai-agents")
    except RunCancelled:
        raise
    except AGENT_RAISES as exc:
        if code_agents.is_ledger_signal(exc):
            raise
        raise code_agents.agent_error(exc) from exc
