"""The run state machine against the contract's diagram (CONTRACT §2), pair by pair.

The expected table below is written from the contract, not from ``ingest.state_machine``; the
test walks every (from status, event type) and every (from, to) pair through ``next_status``.
A static check then proves that no other code path writes ``agent_run.status``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from agentledger.core.errors import CancelRequested, IllegalTransition, LedgerError, RunTerminal
from ingest.state_machine import EVENT_TYPES, next_status

ROOT = Path(__file__).resolve().parent.parent

STATUSES = ("queued", "running", "cancelling", "succeeded", "failed", "cancelled", "interrupted")
TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}

# The arrows of the diagram in CONTRACT §2, each with the one event that draws it.
DIAGRAM = {
    ("queued", "running"): "run.started",
    ("queued", "cancelled"): "run.cancelled",
    ("queued", "interrupted"): "run.interrupted",
    ("running", "succeeded"): "run.completed",
    ("running", "failed"): "run.failed",
    ("running", "cancelling"): "run.cancelling",
    ("running", "interrupted"): "run.interrupted",
    ("cancelling", "cancelled"): "run.cancelled",
    ("cancelling", "interrupted"): "run.interrupted",
}
TARGET = {
    "run.started": "running",
    "run.cancelling": "cancelling",
    "run.completed": "succeeded",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "run.interrupted": "interrupted",
}
# CONTRACT §3: events that report progress and never move the run.
INFORMATIONAL = {
    "message.delta", "tool.call", "tool.result", "usage", "agent.resolved", "agent.handoff",
    "run.child_created", "run.child_finished",
}
ALL_EVENT_TYPES = {"run.queued", *TARGET, *INFORMATIONAL}


def expected(current: str, event_type: str):
    """The contract's answer: the next status, or the error class it must raise."""
    if current in TERMINAL:
        return RunTerminal
    if event_type in INFORMATIONAL:
        return current if current in ("running", "cancelling") else IllegalTransition
    target = TARGET.get(event_type)
    if target is None:
        return IllegalTransition
    if (current, target) in DIAGRAM:
        return target
    if current == "cancelling" and event_type in ("run.completed", "run.failed"):
        return CancelRequested
    return IllegalTransition


def outcome(current: str, event_type: str):
    try:
        return next_status(current, event_type)
    except LedgerError as exc:
        return type(exc)


def test_event_types_are_exactly_the_contract_table():
    assert set(EVENT_TYPES) == ALL_EVENT_TYPES


@pytest.mark.parametrize("current", STATUSES)
def test_every_event_in_every_status_matches_the_contract(current):
    for event_type in sorted(ALL_EVENT_TYPES | {"run.bogus", ""}):
        assert outcome(current, event_type) == expected(current, event_type), (current, event_type)


def test_every_status_pair_is_allowed_exactly_as_drawn():
    for current in STATUSES:
        for to in STATUSES:
            if current == to:
                continue
            movers = {t for t in ALL_EVENT_TYPES if outcome(current, t) == to}
            if (current, to) in DIAGRAM:
                assert movers == {DIAGRAM[(current, to)]}, (current, to, movers)
            else:
                assert movers == set(), f"{current} -> {to} is not in the contract: {movers}"


def test_cancelling_refuses_completion_with_cancel_requested():
    for event_type in ("run.completed", "run.failed"):
        with pytest.raises(CancelRequested):
            next_status("cancelling", event_type)
    assert next_status("cancelling", "run.cancelled") == "cancelled"
    assert next_status("cancelling", "run.interrupted") == "interrupted"


@pytest.mark.parametrize("current", sorted(TERMINAL))
def test_a_terminal_run_never_changes(current):
    for event_type in ALL_EVENT_TYPES:
        with pytest.raises(RunTerminal):
            next_status(current, event_type)


# --- nothing but ingest/events.py writes agent_run.status ----------------------------------

_RAW_SQL_UPDATE_SET = re.compile(r"update\s+\"?agent_run\"?\s+set\b", re.I)
_CLAUSE_END = re.compile(r"\b(where|from|returning)\b", re.I)


def _raw_sql_sets_status(sql: str) -> bool:
    """Whether an ``UPDATE agent_run SET …`` assigns status in its SET list (up to the
    top-level WHERE / FROM / RETURNING; a WHERE that filters on status writes nothing)."""
    for match in _RAW_SQL_UPDATE_SET.finditer(sql):
        depth, start = 0, match.end()
        end = len(sql)
        for i in range(start, len(sql)):
            if sql[i] == "(":
                depth += 1
            elif sql[i] == ")":
                depth -= 1
            elif depth == 0 and _CLAUSE_END.match(sql, i) and (i == 0 or not sql[i - 1].isalnum()):
                end = i
                break
        if re.search(r"(^|[\s,])\"?status\"?\s*=", sql[start:end], re.I):
            return True
    return False


def _calls_update(node: ast.AST) -> bool:
    """Whether a call chain such as ``update(AgentRun).where(…)`` starts with ``update(…)``."""
    while isinstance(node, ast.Call | ast.Attribute):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "update":
                return True
            if isinstance(func, ast.Attribute) and func.attr == "update" and not isinstance(
                func.value, ast.Name
            ):
                return True
            node = func
        else:
            node = node.value
    return False


def _has_status_key(node: ast.AST) -> bool:
    return isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "status" for k in node.keys
    )


def status_writes(source: str) -> list[int]:
    """Line numbers where ``source`` sets a status column in an update (or an ORM attribute)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            kw_status = any(k.arg == "status" for k in node.keywords)
            dict_status = any(_has_status_key(a) for a in node.args) or any(
                k.arg is None and _has_status_key(k.value) for k in node.keywords
            )
            if name == "values" and _calls_update(node.func.value) and (kw_status or dict_status):
                found.append(node.lineno)
            # ``values.update(status=…)``: building the values of an UPDATE in a dict.
            elif name == "update" and isinstance(node.func.value, ast.Name) and kw_status:
                found.append(node.lineno)
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets):
                found.append(node.lineno)
            if any(
                isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                and t.slice.value == "status" and isinstance(t.value, ast.Name)
                and t.value.id == "values"
                for t in targets
            ):
                found.append(node.lineno)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _raw_sql_sets_status(node.value):
                found.append(node.lineno)
    return found


def test_the_status_detector_finds_status_updates():
    """The static check below must be able to fail: it recognises each way of writing status."""
    samples = [
        "session.execute(update(AgentRun).where(AgentRun.id == i).values(status='failed'))",
        "session.execute(update(AgentRun).values({'status': 'failed'}))",
        "values.update(status=status, last_event_seq=seq)",
        "run.status = 'succeeded'",
        "conn.exec_driver_sql(\"UPDATE agent_run SET status = 'failed' WHERE id = ?\")",
        "values['status'] = 'failed'",
        "op.execute(\"UPDATE agent_run SET end_reason = NULL, status = 'failed' WHERE id = 1\")",
    ]
    for sample in samples:
        assert status_writes(sample), sample
    harmless = [
        "session.execute(insert(AgentRun).values(status='queued'))",
        "session.execute(update(ChatSession).values(title='x'))",
        "select(AgentRun.status).where(AgentRun.status == 'queued')",
        "return {'status': 'ok'}",
        "op.execute(\"UPDATE agent_run SET end_reason = e.data ->> 'reason' FROM run_event e"
        " WHERE e.run_id = agent_run.id AND agent_run.status = 'interrupted'\")",
        "op.execute(\"UPDATE agent_run SET end_reason = (SELECT x FROM run_event e WHERE"
        " e.seq = 1) WHERE status = 'interrupted'\")",
    ]
    for sample in harmless:
        assert not status_writes(sample), sample


def test_only_ingest_events_updates_run_status():
    sources = sorted((ROOT / "ingest").rglob("*.py")) + sorted((ROOT / "agentledger").rglob("*.py"))
    # Only code that can reach the database can write a status: a module that imports no
    # database library (the HTTP client's ``ApiError.status``, say) is not searched.
    sources = [p for p in sources if "sqlalchemy" in p.read_text() or "psycopg" in p.read_text()]
    assert ROOT / "ingest" / "events.py" in sources
    offenders = {}
    for path in sources:
        lines = status_writes(path.read_text())
        if path == ROOT / "ingest" / "events.py":
            assert lines, "the detector must find the guarded update in ingest/events.py"
            continue
        if lines:
            offenders[str(path.relative_to(ROOT))] = lines
    assert offenders == {}, f"agent_run.status written outside ingest/events.py: {offenders}"
