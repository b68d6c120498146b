"""``scripted``: runs ``params.steps`` in order (CONTRACT §5), for demos and tests.

Steps: ``{"say": text}``, ``{"sleep": seconds}``, ``{"tool": name, "input": …, "output": …}``,
``{"usage": {…}}`` (priced from ``params.pricing`` when it has no ``cost_usd``), ``{"delegate": [{"agent_id", "input"}, …]}``, ``{"fail": message}``.
"""

from __future__ import annotations

from typing import Any

from agentledger.agent_kinds.pricing import cost_usd
from agentledger.agent_kinds.run_context import AgentFailed, RunContext
from agentledger.core.errors import ValidationFailed
from ingest.event_types import validated_data

STEP_KEYS = ("say", "sleep", "tool", "usage", "delegate", "fail")
MAX_SLEEP = 3600


def validate_steps(steps: Any) -> None:
    if steps is None:
        return
    if not isinstance(steps, list):
        raise ValueError("params.steps must be a list")
    for index, step in enumerate(steps):
        where = f"params.steps[{index}]"
        if not isinstance(step, dict):
            raise ValueError(f"{where} must be an object")
        keys = [k for k in STEP_KEYS if k in step]
        if len(keys) != 1:
            raise ValueError(f"{where} must have exactly one of {', '.join(STEP_KEYS)}")
        key = keys[0]
        value = step[key]
        if key in ("say", "fail") and not isinstance(value, str):
            raise ValueError(f"{where}.{key} must be a string")
        if key == "sleep" and (isinstance(value, bool) or not isinstance(value, int | float)
                               or not 0 <= value <= MAX_SLEEP):
            raise ValueError(f"{where}.sleep must be a number of seconds (0-{MAX_SLEEP})")
        if key == "tool" and not isinstance(value, str):
            raise ValueError(f"{where}.tool must be the tool's name")
        if key == "usage":
            _validate_usage(value, f"{where}.usage")
        if key == "delegate":
            if not isinstance(value, list) or not value:
                raise ValueError(f"{where}.delegate must be a non-empty list")
            for child in value:
                if not isinstance(child, dict) or not isinstance(child.get("agent_id"), str):
                    raise ValueError(f"{where}.delegate items need an agent_id")


def _validate_usage(usage: Any, where: str) -> None:
    """A usage step's counts and cost are checked as its event will be (a step may leave
    out the counts, 0, and the cost, priced at run time), so that a broken definition fails at
    registration rather than in every run."""
    if not isinstance(usage, dict):
        raise ValueError(f"{where} must be an object")
    if "model" in usage and usage["model"] is not None and not isinstance(usage["model"], str):
        raise ValueError(f"{where}.model must be a string")
    sample = {"input_tokens": usage.get("input_tokens", 0),
              "output_tokens": usage.get("output_tokens", 0),
              "cost_usd": usage.get("cost_usd")}
    try:
        validated_data("usage", sample)
    except ValidationFailed as exc:
        raise ValueError(str(exc).replace("usage data", where, 1)) from None


def usage_data(ctx: RunContext, usage: dict[str, Any]) -> dict[str, Any]:
    """A ``usage`` step's event: ``cost_usd`` as given, else priced from ``params.pricing``
    for the step's ``model`` (default: the agent's), else ``null`` (unknown)."""
    tokens_in = int(usage.get("input_tokens", 0))
    tokens_out = int(usage.get("output_tokens", 0))
    model = usage.get("model") or ctx.agent_execution_snapshot.get("model")
    if "cost_usd" in usage:
        cost = None if usage["cost_usd"] is None else float(usage["cost_usd"])
    else:
        cost = cost_usd(ctx.params, model, tokens_in, tokens_out)
    data: dict[str, Any] = {"input_tokens": tokens_in, "output_tokens": tokens_out, "cost_usd": cost}
    if model:
        data["model"] = model
    return data


def run_scripted(ctx: RunContext) -> str | None:
    for step in ctx.params.get("steps") or []:
        if "say" in step:
            ctx.say(str(step["say"]).replace("{input}", ctx.input))
        elif "sleep" in step:
            ctx.sleep(float(step["sleep"]))
        elif "tool" in step:
            ctx.emit("tool.call", {"name": step["tool"], "input": step.get("input", {})})
            ctx.emit("tool.result", {"name": step["tool"], "output": step.get("output", {})})
        elif "usage" in step:
            ctx.emit("usage", usage_data(ctx, step["usage"]))
        elif "delegate" in step:
            ctx.delegate([
                {"agent_id": c["agent_id"], "input": str(c.get("input", ctx.input)).replace("{input}", ctx.input)}
                for c in step["delegate"]
            ])
        elif "fail" in step:
            raise AgentFailed(str(step["fail"]))
    return None
