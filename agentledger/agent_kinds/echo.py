"""``echo``: answers with the user's input."""

from __future__ import annotations

from agentledger.agent_kinds.run_context import RunContext


def run_echo(ctx: RunContext) -> str | None:
    ctx.say(ctx.input)
    return None
