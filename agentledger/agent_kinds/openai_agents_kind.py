"""Kind ``openai-agents``: runs an OpenAI Agents SDK agent on the run's thread (CONTRACT §7)."""

from __future__ import annotations

from typing import Any

from agentledger.agent_kinds import code_agents
from agentledger.agent_kinds.run_context import AgentFailed, RunContext
from agentledger.agent_kinds.storage import openai_agents_installed

EXTRA = "pip install 'agentledger[openai-agents]'"


def validate(params: dict[str, Any]) -> None:
    code_agents.parse_reference(params.get("agent"), "params.agent")
    code_agents.validate_pricing(params)


def run_openai_agent(ctx: RunContext) -> str | None:
    if not openai_agents_installed():
        raise AgentFailed(f"kind openai-agents needs the openai-agents extra on this worker ({EXTRA})",
                          code="agent_unavailable")
    raise AgentFailed("kind openai-agents is not available yet", code="agent_unavailable")
