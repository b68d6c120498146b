"""Agent kinds: what actually produces an answer for a run.

A kind is a callable ``kind(ctx: RunContext) -> str | None``; it reads ``ctx.input``,
``ctx.agent_execution_snapshot`` and ``ctx.context``, reports progress through ``ctx.emit``
(message deltas, tool calls, usage) and may return the final answer (otherwise the answer is
the joined ``message.delta`` texts). Built in: ``echo``, ``scripted``, and the code-defined
agents ``langgraph`` and ``openai-agents`` (their frameworks are imported only when such an
agent is registered or run: ``pip install 'agentledger[langgraph]'`` / ``[openai-agents]``). Other packages add
kinds through the ``agentledger.agent_kinds`` entry-point group, e.g. in their pyproject::

    [project.entry-points."agentledger.agent_kinds"]
    my-llm = "my_package.agent:run_llm"
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from importlib.metadata import entry_points

from agentledger.agent_kinds import langgraph_kind, openai_agents_kind
from agentledger.agent_kinds.echo import run_echo
from agentledger.agent_kinds.pricing import cost_usd, validate_pricing
from agentledger.agent_kinds.run_context import (
    AGENT_RAISES,
    AgentFailed,
    RunCancelled,
    RunContext,
    bind_current_run,
    current_run,
    error_message,
    unbind_current_run,
)
from agentledger.agent_kinds.scripted import run_scripted, validate_steps
from agentledger.core.agent_params import validate_history_limit
from agentledger.core.vocabulary import EXTERNAL_KIND

AgentKind = Callable[[RunContext], "str | None"]

BUILT_IN: dict[str, AgentKind] = {
    "echo": run_echo,
    "scripted": run_scripted,
    "langgraph": langgraph_kind.run_langgraph,
    "openai-agents": openai_agents_kind.run_openai_agent,
}
ENTRY_POINT_GROUP = "agentledger.agent_kinds"


@lru_cache(maxsize=1)
def available_kinds() -> dict[str, AgentKind]:
    kinds = dict(BUILT_IN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        kinds.setdefault(ep.name, ep.load())
    return kinds


def kind_for(name: str) -> AgentKind | None:
    return available_kinds().get(name)


def validate_definition(kind: str, params: dict) -> None:
    """Raise ``ValueError`` with a sentence when a definition cannot run.

    ``external`` (runs recorded elsewhere and received over OTLP) is accepted for registration
    only: its runs are written already terminal, so no worker ever claims one."""
    if kind == EXTERNAL_KIND:
        return
    if kind not in available_kinds():
        raise ValueError(f"unknown agent kind {kind!r}; known: {', '.join(sorted(available_kinds()))}")
    validate_history_limit(params)
    validate_pricing(params.get("pricing"))
    if kind == "scripted":
        validate_steps(params.get("steps"))
    elif kind == "langgraph":
        langgraph_kind.validate(params)
    elif kind == "openai-agents":
        openai_agents_kind.validate(params)


__all__ = [
    "AGENT_RAISES", "AgentFailed", "RunCancelled", "RunContext", "available_kinds", "bind_current_run",
    "cost_usd", "current_run", "error_message", "kind_for", "unbind_current_run",
    "validate_definition",
]
