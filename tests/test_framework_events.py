"""The event data of code-defined agents (CONTRACT §3): ``usage`` with an unknown price and a
model, ``tool.call``/``tool.result`` with a ``call_id``, ``agent.resolved``, ``agent.handoff``."""

from __future__ import annotations

import pytest

from agentledger.agent_kinds.pricing import cost_usd
from agentledger.core.errors import ValidationFailed
from ingest.event_types import EXECUTOR_APPENDABLE, validated_data

RESOLVED = {"name": "graph", "model": None, "instructions_sha256": None, "tools": ["t"],
            "source": "pkg.mod:graph", "package": "pkg", "package_version": None,
            "content_hash": "ab" * 32, "checkpoint_id": None}


def test_usage_cost_may_be_unknown_but_never_negative():
    data = {"input_tokens": 3, "output_tokens": 4, "cost_usd": None, "model": "m"}
    assert validated_data("usage", data) == data
    with pytest.raises(ValidationFailed, match="cost_usd"):
        validated_data("usage", {"input_tokens": 3, "output_tokens": 4, "cost_usd": -1})
    with pytest.raises(ValidationFailed, match="cost_usd"):
        validated_data("usage", {"input_tokens": 3, "output_tokens": 4})


def test_tool_events_carry_call_ids():
    assert validated_data("tool.call", {"name": "t", "input": {}, "call_id": "c1"})["call_id"] == "c1"
    with pytest.raises(ValidationFailed, match="call_id"):
        validated_data("tool.result", {"name": "t", "output": 1, "call_id": 5})


def test_resolved_and_handoff_data():
    assert validated_data("agent.resolved", RESOLVED) == RESOLVED
    with pytest.raises(ValidationFailed, match="source"):
        validated_data("agent.resolved", {k: v for k, v in RESOLVED.items() if k != "source"})
    assert validated_data("agent.handoff", {"from_agent": "A", "to_agent": "B"})
    with pytest.raises(ValidationFailed, match="to_agent"):
        validated_data("agent.handoff", {"from_agent": "A"})
    assert {"agent.resolved", "agent.handoff"} <= EXECUTOR_APPENDABLE


def test_cost_from_pricing():
    pricing = {"pricing": {"m": {"input_per_million": 2.0, "output_per_million": 8.0}}}
    assert cost_usd(pricing, "m", 1_000_000, 500_000) == pytest.approx(6.0)
    assert cost_usd(pricing, "other", 10, 10) is None
    assert cost_usd({}, "m", 10, 10) is None
    assert cost_usd(pricing, None, 10, 10) is None
