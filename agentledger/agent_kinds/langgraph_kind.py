"""Kind ``langgraph``: runs a LangGraph graph on the run's thread (CONTRACT §7).

``params.graph`` is ``"package.module:attr"``: a ``StateGraph`` (compiled here with the
ledger's checkpointer) or a callable that takes the checkpointer and returns a compiled graph.
The graph is driven synchronously (``graph.stream`` with LangGraph's sync savers), so its nodes,
conditional edges and tools must be synchronous functions: an ``async def`` one is refused at
registration, and fails a run ``agent_unavailable`` before it starts when only the run sees it
(a factory's graph, or a module changed since). LangGraph is imported only when such a run (or
registration) happens, so the base install works without the extra.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agentledger.agent_kinds import code_agents
from agentledger.agent_kinds.code_agents import Unavailable
from agentledger.agent_kinds.framework_thread import WriteFence, run_in_own_thread
from agentledger.agent_kinds.run_context import AGENT_RAISES, AgentFailed, RunContext
from agentledger.agent_kinds.storage import langgraph_installed

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

EXTRA = "pip install 'agentledger[langgraph]'"
# The saver's methods that change a thread's checkpoints (those it has; "a" = asyncio twin).
CHECKPOINT_WRITES = tuple(f"{prefix}{name}" for prefix in ("", "a") for name in (
    "put", "put_writes", "delete_thread", "delete_for_runs", "copy_thread", "prune"))


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


def _async_only(runnable: Any) -> bool:
    """Whether LangGraph can call ``runnable`` only asynchronously: its ``RunnableCallable`` or
    LangChain's ``RunnableLambda`` made of an ``async def`` (or an async generator) has an
    ``afunc`` and no ``func``; its sync ``invoke`` raises ``TypeError``. Also as a step of a
    sequence (``a | b``)."""
    if getattr(runnable, "func", None) is None and getattr(runnable, "afunc", None) is not None:
        return True
    steps = getattr(runnable, "steps", None)  # RunnableSequence, LangGraph's RunnableSeq
    return isinstance(steps, list) and any(_async_only(step) for step in steps)


def _async_parts(builder: Any, within: str = "", seen: set[int] | None = None) -> list[str]:
    """The parts of a ``StateGraph``, and of graphs compiled into it as nodes, that have no
    synchronous implementation: nodes, conditional edges and the tools of its ``ToolNode``s."""
    from langgraph.graph import StateGraph

    seen = set() if seen is None else seen
    if id(builder) in seen:
        return []
    seen.add(id(builder))
    parts: list[str] = []
    for name, spec in builder.nodes.items():
        runnable = spec.runnable
        if _async_only(runnable):
            parts.append(f'{within}node "{name}"')
        tools = getattr(runnable, "tools_by_name", None)
        if isinstance(tools, dict):
            # An ``@tool async def`` is a tool with a coroutine and no function.
            parts.extend(f'{within}tool "{tool_name}" of node "{name}"'
                         for tool_name, tool in tools.items()
                         if getattr(tool, "func", True) is None
                         and getattr(tool, "coroutine", None) is not None)
        inner = getattr(runnable, "builder", None)  # a compiled graph as a node: a subgraph
        if isinstance(inner, StateGraph):
            parts.extend(_async_parts(inner, f'{within}node "{name}" > ', seen))
    for source, branches in builder.branches.items():
        parts.extend(f'{within}conditional edge "{name}" from node "{source}"'
                     for name, branch in branches.items() if _async_only(branch.path))
    return parts


def _check_synchronous(builder: Any, where: str) -> None:
    """``Unavailable`` naming every async part of the graph: this kind drives it with the
    sync ``graph.stream`` and LangGraph's sync savers, where such a part always fails."""
    parts = _async_parts(builder)
    if not parts:
        return
    named = ", ".join(parts[:10]) + (f" and {len(parts) - 10} more" if len(parts) > 10 else "")
    raise Unavailable(
        f"{where}: {named} {'is an async function' if len(parts) == 1 else 'are async functions'}"
        "; nodes must be synchronous functions (def, not async def) for the langgraph kind, "
        "and so must conditional edges and tools: it runs the graph with LangGraph's "
        "synchronous stream and checkpointers")


def validate(params: dict[str, Any]) -> None:
    """Registration check: a sentence (``ValueError``) when ``params.graph`` cannot run."""
    code_agents.parse_reference(params.get("graph"), "params.graph")
    if not langgraph_installed():
        return  # this server can't import it; the workers that run it will tell
    from langgraph.graph import StateGraph

    obj, _, _ = code_agents.load_reference(params["graph"], "params.graph")
    _check_object(obj, "params.graph")
    if isinstance(obj, StateGraph):  # a factory's graph is seen only when a run builds it
        _check_synchronous(obj, "params.graph")


def _compiled(obj: Any, checkpointer: Any, where: str):
    from langgraph.graph import StateGraph
    from langgraph.pregel import Pregel

    _check_object(obj, where)
    graph = obj.compile(checkpointer=checkpointer) if isinstance(obj, StateGraph) else obj(checkpointer)
    if not isinstance(graph, Pregel):
        raise Unavailable(f"{where} returned a {type(graph).__name__}, not a compiled graph")
    # Again here: a factory's graph, or a module changed since registration.
    builder = getattr(graph, "builder", None)
    if isinstance(builder, StateGraph):
        _check_synchronous(builder, where)
    return graph


def _tool_names(graph) -> list[str]:
    names: list[str] = []
    for part in (graph, *(sub for _, sub in graph.get_subgraphs(recurse=True))):
        builder = getattr(part, "builder", None)
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


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _response_usages(response: Any) -> list[tuple[str | None, Any, Any]]:
    """(model, input tokens, output tokens) of each response in one ``on_llm_end``.

    Each list of ``response.generations`` is one prompt's response; its choices (``n`` > 1)
    carry that one response's usage each, so its first ``usage_metadata`` is taken. A model
    that reports usage only in ``llm_output`` (``token_usage`` / ``usage``; LangChain's
    completion LLMs) is read there."""
    found: list[tuple[str | None, Any, Any]] = []
    for choices in getattr(response, "generations", None) or []:
        for generation in choices:
            message = getattr(generation, "message", None)
            usage = getattr(message, "usage_metadata", None)
            if usage:
                meta = getattr(message, "response_metadata", None) or {}
                found.append((_text_or_none(meta.get("model_name")) or _text_or_none(meta.get("model")),
                              usage.get("input_tokens"), usage.get("output_tokens")))
                break
    if found:
        return found
    output = getattr(response, "llm_output", None) or {}
    usage = output.get("token_usage") or output.get("usage")
    if isinstance(usage, dict):
        tokens_in = _count(usage.get("input_tokens", usage.get("prompt_tokens")))
        tokens_out = _count(usage.get("output_tokens", usage.get("completion_tokens")))
        if tokens_in is not None or tokens_out is not None:
            found.append((_text_or_none(output.get("model_name")) or _text_or_none(output.get("model")),
                          tokens_in, tokens_out))
    return found


def _usage_callback(ctx: RunContext):
    from langchain_core.callbacks import BaseCallbackHandler

    class ReportUsage(BaseCallbackHandler):
        """One ``usage`` per model response, from LangChain's ``on_llm_end``: every chat model or
        LLM call the graph's callbacks reach (nodes, conditional edges, tools, subgraphs, and
        calls whose reply never reaches the state: a router, a classifier, a summariser), once
        per call (its callback run id), and none for the thread's earlier messages. Usage is
        not read from the messages in the state: a reply kept out of ``messages`` would be
        missed, and one put there twice (or rebuilt by a node) could be counted twice.

        ``model``: the response's ``model_name`` / ``model``, else the name the model was
        called with (LangChain's ``ls_model_name``), else the agent definition's model."""

        raise_error = True  # a refused write or a cancel stops the graph, as elsewhere
        run_inline = True

        def __init__(self) -> None:
            self._lock = threading.Lock()  # parallel nodes call back from their own threads
            self._requested: dict[Any, str] = {}
            self._reported: set[Any] = set()

        def _started(self, run_id: Any, metadata: dict[str, Any] | None) -> None:
            name = _text_or_none((metadata or {}).get("ls_model_name"))
            if name is not None:
                with self._lock:
                    self._requested[run_id] = name

        def on_chat_model_start(self, serialized, messages, *, run_id, metadata=None, **kwargs):
            self._started(run_id, metadata)

        def on_llm_start(self, serialized, prompts, *, run_id, metadata=None, **kwargs):
            self._started(run_id, metadata)

        def on_llm_error(self, error, *, run_id, **kwargs):
            with self._lock:
                self._requested.pop(run_id, None)

        def on_llm_end(self, response, *, run_id, **kwargs):
            with self._lock:
                if run_id in self._reported:
                    return
                self._reported.add(run_id)
                requested = self._requested.pop(run_id, None)
            for model, tokens_in, tokens_out in _response_usages(response):
                code_agents.usage_event(
                    ctx, model or requested or ctx.agent_execution_snapshot.get("model") or None,
                    tokens_in, tokens_out)

    return ReportUsage()


class _Reporter:
    """Tool calls and tool results of the messages the graph's nodes return, each once.

    With subgraphs one message is in several updates: that of the subgraph's node that made it,
    then that of each enclosing graph's node (the subgraph's whole output, the thread's earlier
    messages included). So each tool call and tool result is reported the first time it is
    seen, and those of the thread's messages before the run count as seen. (Usage comes from
    the model calls themselves: ``_usage_callback``.)"""

    def __init__(self, ctx: RunContext, earlier: Any):
        self.ctx = ctx
        self.seen: set[tuple[str, str]] = set()
        for message in self._messages(earlier):
            self._new(message)

    @staticmethod
    def _messages(raw: Any) -> list:
        from langchain_core.messages.utils import convert_to_messages

        if raw is None:
            return []
        try:
            return convert_to_messages(raw if isinstance(raw, list | tuple) else [raw])
        except (ValueError, TypeError, NotImplementedError):
            return []

    def _first(self, kind: str, key: str | None) -> bool:
        if key is None:  # nothing to recognise it by: reported as it comes
            return True
        if (kind, key) in self.seen:
            return False
        self.seen.add((kind, key))
        return True

    def _new(self, message) -> list[tuple[str, Any]]:
        """What of ``message`` was not seen yet, now seen: ("tool.call", call) or
        ("tool.result", None)."""
        from langchain_core.messages import AIMessage, ToolMessage

        new: list[tuple[str, Any]] = []
        if isinstance(message, AIMessage):
            new.extend(("tool.call", call) for call in message.tool_calls
                       if self._first("tool.call", call.get("id")))
        elif isinstance(message, ToolMessage) and self._first("tool.result", message.tool_call_id):
            new.append(("tool.result", None))
        return new

    def update(self, update: Any) -> None:
        ctx = self.ctx
        for item in update if isinstance(update, list | tuple) else [update]:
            if not isinstance(item, dict):
                continue
            for message in self._messages(item.get("messages")):
                for kind, part in self._new(message):
                    if kind == "tool.call":
                        ctx.emit("tool.call", {"name": part["name"],
                                               "input": code_agents.as_json(part["args"]),
                                               "call_id": part.get("id")})
                    else:
                        ctx.emit("tool.result", {"name": message.name or "tool",
                                                 "output": code_agents.as_json(message.content),
                                                 "call_id": message.tool_call_id})


def _pending(interrupts: Any) -> list[tuple[str, Any]]:
    """``(id, value)`` of each interrupt pending on the thread, in LangGraph's order, once each."""
    found: dict[str, Any] = {}
    for item in interrupts or ():
        found.setdefault(item.id, code_agents.as_json(item.value))
    return list(found.items())


def _answers_by_id(content: str, pending_ids: set[str]) -> dict[str, Any] | None:
    """The message as answers by interrupt id: a JSON object whose keys are all pending
    interrupt ids (some or all of them); else ``None``."""
    try:
        answers = json.loads(content)
    except ValueError:
        return None
    if isinstance(answers, dict) and answers and set(answers) <= pending_ids:
        return answers
    return None


def _resume(content: str, pending: list[tuple[str, Any]]) -> Any:
    """The ``Command`` that resumes a thread with pending interrupts with the run's message.

    A JSON object keyed by pending interrupt ids answers those interrupts
    (``Command(resume={id: answer})``, LangGraph's own form; the ones it leaves out stay
    pending). Otherwise the message is the answer of the one pending interrupt
    (``Command(resume=<content>)``). With several pending, a message that does not answer them
    by id fails the run without running the graph (LangGraph itself refuses a plain resume
    then): the thread is left as it was, for a next message that does."""
    from langgraph.types import Command

    answers = _answers_by_id(content, {interrupt_id for interrupt_id, _ in pending})
    if answers is not None:
        return Command(resume=answers)
    if len(pending) == 1:
        return Command(resume=content)
    listed = json.dumps(dict(pending), ensure_ascii=False, default=str)
    if len(listed) > 4000:
        listed = listed[:4000] + "…"
    example = json.dumps({interrupt_id: "…" for interrupt_id, _ in pending[:2]}, ensure_ascii=False)
    raise AgentFailed(
        f"{len(pending)} interrupts of the graph are waiting for an answer; answer them in one "
        f"message that is a JSON object mapping interrupt ids to answers, e.g. {example} "
        f"(an id left out stays pending). Pending (id: value): {listed}", code="agent_error")


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
    if ctx.storage is None and ctx.memory is None:
        raise AgentFailed("kind langgraph keeps its checkpoints in the ledger database; this "
                          "executor has neither database access nor a ledger server to keep "
                          "them", code="agent_unavailable")
    try:
        obj, module_name, attr = code_agents.load_reference(ctx.params.get("graph"), "params.graph")
    except Unavailable as exc:
        raise code_agents.unavailable(exc) from None
    fence = WriteFence()
    return run_in_own_thread(ctx, lambda: _run_graph(ctx, obj, module_name, attr, fence),
                             fence=fence, name="langgraph")


@contextmanager
def _checkpointer(ctx: RunContext) -> Iterator[Any]:
    """LangGraph's own saver on the ledger database, or, for an executor without database
    access, the saver that asks the ledger server to use that same saver there."""
    if ctx.storage is not None:
        with ctx.storage.checkpoints.saver() as saver:
            yield saver
        return
    from agentledger.agent_kinds.remote_checkpointer import RemoteCheckpointSaver

    assert ctx.memory is not None
    yield RemoteCheckpointSaver(ctx.memory, ctx.thread_id)


def _run_graph(ctx: RunContext, obj: Any, module_name: str, attr: str,
               fence: WriteFence) -> str | None:
    """The graph's run, in a thread of its own (``framework_thread``), which also opens and
    closes the checkpointer: a graph abandoned by a cancel keeps its connection until it ends."""
    from langchain_core.messages import AIMessage

    with _checkpointer(ctx) as checkpointer:
        fence.guard(checkpointer, *CHECKPOINT_WRITES)
        try:
            graph = _compiled(obj, checkpointer, "params.graph")
        except Unavailable as exc:
            raise code_agents.unavailable(exc) from None
        except AGENT_RAISES as exc:
            if code_agents.is_ledger_signal(exc):
                raise
            raise code_agents.agent_error(exc) from exc
        config: RunnableConfig = {"configurable": {"thread_id": ctx.thread_id},
                                  "callbacks": [_cancel_callback(ctx), _usage_callback(ctx)]}
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
            waiting = _pending(before.interrupts)
            if waiting:
                graph_input: Any = _resume(ctx.input, waiting)
            else:
                graph_input = {"messages": [{"role": "user", "content": ctx.input}]}
            values = before.values if isinstance(before.values, dict) else {}
            report = _Reporter(ctx, values.get("messages"))
            # "sync": each checkpoint is saved before the next step starts (LangGraph's default
            # saves it while the next step runs), so a worker killed mid-graph leaves the
            # thread's memory holding every step it began with, this run's question included.
            # ``subgraphs``: chunks, tool calls and tool results of a graph run as a node of
            # another come as they happen, not once in the enclosing node's final update.
            # (Usage comes from the model calls' own callbacks, ``_usage_callback``.)
            for _namespace, mode, chunk in graph.stream(
                    graph_input, config, durability="sync", subgraphs=True,
                    stream_mode=["messages", "updates"]):
                ctx.check_cancel()
                if mode == "messages":
                    message, _meta = chunk
                    if isinstance(message, AIMessage) and message.text:
                        ctx.say(message.text)
                elif isinstance(chunk, dict):
                    for node, update in chunk.items():
                        if node != "__interrupt__":
                            report.update(update)
            ctx.check_cancel()
            after = graph.get_state(config)
        except AGENT_RAISES as exc:
            if code_agents.is_ledger_signal(exc):
                raise
            raise code_agents.agent_error(exc) from exc
    waiting = _pending(after.interrupts)
    if not waiting:
        return _final_answer(after)
    # One interrupt: its value is the answer. Several (nodes of one step interrupting in
    # parallel): ``interrupt`` stays the first one's value, ``interrupts`` lists them all with
    # their ids, and the answer is {id: value} as JSON, the shape of the message that answers.
    ctx.completion.update({"awaiting_input": True, "interrupt": waiting[0][1]})
    if len(waiting) == 1:
        return code_agents.as_text(waiting[0][1])
    ctx.completion["interrupts"] = [{"id": interrupt_id, "value": value}
                                    for interrupt_id, value in waiting]
    return code_agents.as_text(dict(waiting))
