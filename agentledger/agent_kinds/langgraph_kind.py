"""Kind ``langgraph``: runs a LangGraph graph on the run's thread (CONTRACT §7).

``params.graph`` is ``"package.module:attr"``: a ``StateGraph`` (compiled here with the
ledger's checkpointer) or a callable that takes the checkpointer and returns a compiled graph.
LangGraph is imported only when such a run (or registration) happens, so the base install works
without the extra.
"""

from __future__ import annotations

from typing import Any

from agentledger.agent_kinds import code_agents
from agentledger.agent_kinds.code_agents import Unavailable
from agentledger.agent_kinds.run_context import AgentFailed, RunContext
from agentledger.agent_kinds.storage import langgraph_checkpointer, langgraph_installed

EXTRA = "pip install 'agentledger[langgraph]'"


def _check_object(obj: Any, where: str) -> None:
    from langgraph.graph import StateGraph
    from langgraph.pregel import Pregel

    if isinstance(obj, StateGraph):
        return
    if isinstance(obj, Pregel):
        raise Unavailable(f"{where} names a compiled graph; name the StateGraph itself, or a "
                          "callable that takes the checkpointer and returns the compiled graph")
    if not callable(obj) or isinstance(obj, type):
        raise Unavailable(f"{where} names a {type(obj).__name__}, not a LangGraph StateGraph "
                          "or a callable that takes the checkpointer and returns a compiled graph")


def validate(params: dict[str, Any]) -> None:
    """Registration check: a sentence (``ValueError``) when ``params.graph`` cannot run."""
    code_agents.parse_reference(params.get("graph"), "params.graph")
    if not langgraph_installed():
        return  # this server can't import it; the workers that run it will tell
    obj, _, _ = code_agents.load_reference(params["graph"], "params.graph")
    _check_object(obj, "params.graph")


def _compiled(obj: Any, checkpointer: Any, where: str):
    from langgraph.graph import StateGraph
    from langgraph.pregel import Pregel

    _check_object(obj, where)
    graph = obj.compile(checkpointer=checkpointer) if isinstance(obj, StateGraph) else obj(checkpointer)
    if not isinstance(graph, Pregel):
        raise Unavailable(f"{where} returned a {type(graph).__name__}, not a compiled graph")
    return graph


def _tool_names(graph) -> list[str]:
    names: list[str] = []
    builder = getattr(graph, "builder", None)
    for spec in (getattr(builder, "nodes", None) or {}).values():
        tools = getattr(getattr(spec, "runnable", None), "tools_by_name", None)
        if isinstance(tools, dict):
            names.extend(tools)
    return names


def _cancel_callback(ctx: RunContext):
    from langchain_core.callbacks import BaseCallbackHandler

    class StopOnCancel(BaseCallbackHandler):
        """Raises ``RunCancelled`` inside the graph: no further node, model token or tool."""

        raise_error = True
        run_inline = True

        def _check(self, *args, **kwargs) -> None:
            ctx.check_cancel()

        on_chain_start = on_chat_model_start = on_llm_start = on_llm_new_token = _check
        on_tool_start = on_retriever_start = _check

    return StopOnCancel()


def _model_of(message, ctx: RunContext) -> str | None:
    meta = getattr(message, "response_metadata", None) or {}
    return (meta.get("model_name") or meta.get("model")
            or ctx.agent_execution_snapshot.get("model") or None)


def _report_update(ctx: RunContext, update: Any) -> None:
    """Tool calls, tool results and usage of the messages a node returned."""
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.messages.utils import convert_to_messages

    updates = update if isinstance(update, list | tuple) else [update]
    for item in updates:
        if not isinstance(item, dict):
            continue
        raw = item.get("messages")
        if raw is None:
            continue
        try:
            messages = convert_to_messages(raw if isinstance(raw, list | tuple) else [raw])
        except (ValueError, TypeError, NotImplementedError):
            continue
        for message in messages:
            if isinstance(message, AIMessage):
                for call in message.tool_calls:
                    ctx.emit("tool.call", {"name": call["name"], "input": code_agents.as_json(call["args"]),
                                           "call_id": call.get("id")})
                usage = message.usage_metadata
                if usage:
                    code_agents.usage_event(ctx, _model_of(message, ctx),
                                            usage.get("input_tokens"), usage.get("output_tokens"))
            elif isinstance(message, ToolMessage):
                ctx.emit("tool.result", {"name": message.name or "tool",
                                         "output": code_agents.as_json(message.content),
                                         "call_id": message.tool_call_id})


def _final_answer(state) -> str | None:
    from langchain_core.messages import AIMessage

    values = state.values if isinstance(state.values, dict) else {}
    for message in reversed(values.get("messages") or []):
        if isinstance(message, AIMessage):
            return message.text
    return None


def run_langgraph(ctx: RunContext) -> str | None:
    if not langgraph_installed():
        raise AgentFailed(f"kind langgraph needs the langgraph extra on this worker ({EXTRA})",
                          code="agent_unavailable")
    if not ctx.database_url:
        raise AgentFailed("kind langgraph keeps its checkpoints in the ledger database; this "
                          "executor has no database access", code="agent_unavailable")
    from langchain_core.messages import AIMessage
    from langgraph.types import Command

    try:
        obj, module_name, attr = code_agents.load_reference(ctx.params.get("graph"), "params.graph")
    except Unavailable as exc:
        raise code_agents.unavailable(exc) from None
    with langgraph_checkpointer(ctx.database_url) as checkpointer:
        try:
            graph = _compiled(obj, checkpointer, "params.graph")
        except Unavailable as exc:
            raise code_agents.unavailable(exc) from None
        except Exception as exc:
            if code_agents.is_ledger_signal(exc):
                raise
            raise code_agents.agent_error(exc) from exc
        config: dict[str, Any] = {"configurable": {"thread_id": ctx.thread_id},
                                  "callbacks": [_cancel_callback(ctx)]}
        try:
            before = graph.get_state(config)
            start_id = (before.config or {}).get("configurable", {}).get("checkpoint_id")
            name = graph.get_name()
            ctx.emit("agent.resolved", code_agents.resolved(
                name=attr if name == "LangGraph" else name,
                model=ctx.agent_execution_snapshot.get("model"),
                instructions=ctx.agent_execution_snapshot.get("instructions"),
                tools=_tool_names(graph), module_name=module_name, attr=attr,
                checkpoint_id=start_id))
            ctx.check_cancel()
            if before.interrupts:
                graph_input: Any = Command(resume=ctx.input)
            else:
                graph_input = {"messages": [{"role": "user", "content": ctx.input}]}
            # "sync": each checkpoint is saved before the next step starts (LangGraph's default
            # saves it while the next step runs), so a worker killed mid-graph leaves the
            # thread's memory holding every step it began with, this run's question included.
            for mode, chunk in graph.stream(graph_input, config, durability="sync",
                                            stream_mode=["messages", "updates"]):
                ctx.check_cancel()
                if mode == "messages":
                    message, _meta = chunk
                    if isinstance(message, AIMessage) and message.text:
                        ctx.say(message.text)
                elif isinstance(chunk, dict):
                    for node, update in chunk.items():
                        if node != "__interrupt__":
                            _report_update(ctx, update)
            ctx.check_cancel()
            after = graph.get_state(config)
        except Exception as exc:
            if code_agents.is_ledger_signal(exc):
                raise
            raise code_agents.agent_error(exc) from exc
    if after.interrupts:
        value = code_agents.as_json(after.interrupts[0].value)
        ctx.completion.update({"awaiting_input": True, "interrupt": value})
        return code_agents.as_text(value)
    return _final_answer(after)
