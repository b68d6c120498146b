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
import json
from collections.abc import Awaitable, Callable
from typing import Any

from agentledger.agent_kinds import code_agents
from agentledger.agent_kinds.code_agents import Unavailable
from agentledger.agent_kinds.framework_thread import CANCEL_POLL, WriteFence, run_in_own_thread
from agentledger.agent_kinds.run_context import AgentFailed, RunCancelled, RunContext
from agentledger.agent_kinds.storage import openai_agents_installed, sdk_session

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


class _Reporter:
    """Turns the SDK's stream events into ledger events."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.tool_names: dict[str, str] = {}

    def __call__(self, event: Any) -> None:
        ctx = self.ctx
        if event.type == "raw_response_event":
            data = event.data
            if data.type == "response.output_text.delta" and data.delta:
                ctx.say(data.delta)
            elif data.type == "response.completed" and data.response.usage is not None:
                usage = data.response.usage
                code_agents.usage_event(ctx, data.response.model or None,
                                        usage.input_tokens, usage.output_tokens)
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
    if ctx.database_url:
        session = sdk_session(ctx.thread_id, ctx.database_url)
        return session, session.engine.dispose
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
        result = Runner.run_streamed(
            agent, ctx.input, session=session,
            run_config=RunConfig(tracing_disabled=not ctx.params.get("sdk_tracing", False)))
        watcher = asyncio.create_task(_watch_cancel(ctx, result))
        report = _Reporter(ctx)
        async for event in result.stream_events():
            ctx.check_cancel()
            report(event)
        ctx.check_cancel()
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
    if not ctx.database_url and ctx.memory is None:
        raise AgentFailed("kind openai-agents keeps its sessions in the ledger database; this "
                          "executor has neither database access nor a ledger server to keep "
                          "them", code="agent_unavailable")
    try:
        obj, module_name, attr = code_agents.load_reference(ctx.params.get("agent"), "params.agent")
        agent = _agent(obj, "params.agent")
    except Unavailable as exc:
        raise code_agents.unavailable(exc) from None
    except Exception as exc:
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
    except Exception as exc:
        if code_agents.is_ledger_signal(exc):
            raise
        raise code_agents.agent_error(exc) from exc
