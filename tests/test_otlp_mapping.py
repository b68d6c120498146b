"""What spans become in the ledger (``ingest.otlp``; CONTRACT §8, docs/otlp.md): which spans are
runs, which agent and version a run is filed under, and what its ``run.started`` says. Through
``receive_spans``, on SQLite and PostgreSQL; every chain written verifies."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from support.ledger import assert_chains_ok

from agentledger.core.schema import (
    Agent,
    AgentRun,
    AgentVersion,
    ChatSession,
    Message,
    OtlpSpan,
    RunEvent,
)
from ingest.otlp import receive_spans
from ingest.otlp.wire import ReceivedSpan

T0 = datetime(2026, 12, 1, 9, tzinfo=UTC)
OWNER = "alice"


def _span(trace: int, span: int, parent: int | None, attrs: dict, start_ms: int, end_ms: int,
          *, name: str | None = None, service: str = "svc") -> ReceivedSpan:
    return ReceivedSpan(f"{trace:032x}", f"{span:016x}", None if parent is None else f"{parent:016x}",
                        service, attrs.get("gen_ai.operation.name", "span") if name is None else name,
                        T0 + timedelta(milliseconds=start_ms), T0 + timedelta(milliseconds=end_ms),
                        0, None, attrs)


def _agent(**attrs) -> dict:
    return {"gen_ai.operation.name": "invoke_agent", "input.value": "hi", **attrs}


def _chat(**attrs) -> dict:
    return {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 3,
            "gen_ai.usage.output_tokens": 2, **attrs}


def _runs(db, trace: int) -> list[AgentRun]:
    """The runs recorded from a trace, parents before children."""
    with db.read() as s:
        ids = s.execute(select(OtlpSpan.run_id).where(
            OtlpSpan.trace_id == f"{trace:032x}", OtlpSpan.run_id.is_not(None),
            OtlpSpan.run_id != "")).scalars().all()
        runs = s.execute(select(AgentRun).where(AgentRun.id.in_(set(ids)))
                         .order_by(AgentRun.created_at, AgentRun.parent_run_id.is_not(None))
                         ).scalars().all()
        s.expunge_all()
        return list(runs)


def _events(db, run_id: str) -> list[tuple[str, dict]]:
    with db.read() as s:
        return [(e.type, e.data) for e in s.execute(
            select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.seq)).scalars()]


def _versions(db, agent_id: str) -> list[AgentVersion]:
    with db.read() as s:
        rows = s.execute(select(AgentVersion).where(AgentVersion.agent_id == agent_id)
                         .order_by(AgentVersion.version)).scalars().all()
        s.expunge_all()
        return list(rows)


# ---- the agent: id, display name, versions ----------------------------------------------------


def test_the_agent_id_comes_from_gen_ai_agent_id_and_its_name_from_gen_ai_agent_name(db):
    spans = [_span(1, 1, None, _agent(**{"gen_ai.agent.id": "planner-t1",
                                         "gen_ai.agent.name": "Planner"}), 0, 100),
             _span(2, 1, None, _agent(**{"gen_ai.agent.id": "solo-7"}), 0, 100),
             _span(3, 1, None, _agent(**{"gen_ai.agent.name": "Trip Booker"}), 0, 100)]
    assert receive_spans(db, OWNER, spans).runs_written == 3
    for trace, agent_id, name in ((1, "planner-t1", "Planner"), (2, "solo-7", "solo-7"),
                                  (3, "trip-booker", "Trip Booker")):
        (run,) = _runs(db, trace)
        assert run.agent_id == agent_id
        assert run.agent_execution_snapshot["name"] == name
        assert [(v.name, v.kind) for v in _versions(db, agent_id)] == [(name, "external")]
    assert_chains_ok(db)


def test_names_without_an_ascii_spelling_are_ids_of_their_own(db):
    """A slug keeps ASCII letters and digits only: every name written in another script (and
    every emoji name) was the id ``agent``, so runs of 助手 and Агент were filed as one agent's.
    Accents are dropped rather than the letters that carry them."""
    names = ["助手", "分析师", "Агент", "😀😀", "Ünïcödé Àgent", "Agent — Pro"]
    spans = [_span(10 + n, 1, None, _agent(**{"gen_ai.agent.name": name}), 0, 100)
             for n, name in enumerate(names)]
    assert receive_spans(db, OWNER, spans).runs_written == len(names)
    ids = {}
    for n, name in enumerate(names):
        (run,) = _runs(db, 10 + n)
        assert run.agent_execution_snapshot["name"] == name
        ids[name] = run.agent_id
    assert len(set(ids.values())) == len(names), ids
    assert ids["Ünïcödé Àgent"] == "unicode-agent" and ids["Agent — Pro"] == "agent-pro"
    assert all(re.fullmatch(r"agent-[0-9a-f]{10}", ids[name]) for name in names[:4]), ids
    again = [_span(20, 1, None, _agent(**{"gen_ai.agent.name": "Агент"}), 0, 100)]
    assert receive_spans(db, OWNER, again).runs_written == 1
    assert _runs(db, 20)[0].agent_id == ids["Агент"]  # the same name, the same agent
    assert_chains_ok(db)


def test_only_what_a_trace_observed_is_compared_with_the_current_version(db):
    tools = json.dumps([{"type": "function", "name": "lookup"}])
    full = _agent(**{"gen_ai.agent.name": "versioned", "gen_ai.request.model": "m-b",
                     "gen_ai.system_instructions": "be brief", "gen_ai.tool.definitions": tools})
    bare = _agent(**{"gen_ai.agent.name": "versioned"})
    receive_spans(db, OWNER, [_span(1, 1, None, full, 0, 100)])
    # Nothing captured (no model, instructions or tools on any span): the current version.
    receive_spans(db, OWNER, [_span(2, 1, None, bare, 0, 100),
                              _span(2, 2, 1, _chat(), 10, 20)])
    (run,) = _runs(db, 2)
    assert run.agent_version == 1 and len(_versions(db, "versioned")) == 1
    # New instructions observed, the model not: a new version that keeps the model and tools.
    receive_spans(db, OWNER, [_span(3, 1, None, {**bare, "gen_ai.system_instructions": "be terse"},
                                    0, 100)])
    # A new model observed on a model span: another version, keeping the newer instructions.
    receive_spans(db, OWNER, [_span(4, 1, None, bare, 0, 100),
                              _span(4, 2, 1, _chat(**{"gen_ai.response.model": "m-c"}), 10, 20)])
    # The same model again, nothing else captured: no version.
    receive_spans(db, OWNER, [_span(5, 1, None, {**bare, "gen_ai.request.model": "m-c"}, 0, 100)])
    versions = [(v.version, v.model, v.instructions, v.tools) for v in _versions(db, "versioned")]
    assert versions == [(1, "m-b", "be brief", ["lookup"]), (2, "m-b", "be terse", ["lookup"]),
                        (3, "m-c", "be terse", ["lookup"])]
    assert [_runs(db, t)[0].agent_version for t in (1, 2, 3, 4, 5)] == [1, 1, 2, 3, 3]
    with db.read() as s:
        assert s.get(Agent, "versioned").latest_version == 3
    assert_chains_ok(db)


# ---- which spans are runs ---------------------------------------------------------------------


def test_a_root_span_with_genai_or_openinference_attributes_is_a_run_a_plain_one_is_not(db):
    oi_root = {"input.value": "what is up?", "output.value": "all good",
               "session.id": "chat-42"}
    chain_root = {"openinference.span.kind": "CHAIN", "input.value": "summarise",
                  "output.value": "done"}
    genai_root = {"gen_ai.system": "openai", "gen_ai.input.messages": json.dumps(
        [{"role": "user", "parts": [{"type": "text", "content": "hello"}]}])}
    plain = {"http.request.method": "GET", "url.path": "/health"}
    outcome = receive_spans(db, OWNER, [
        _span(1, 1, None, oi_root, 0, 100, name="handle"),
        _span(2, 1, None, chain_root, 0, 100, name="pipeline"),
        _span(3, 1, None, genai_root, 0, 100, name="answer"),
        _span(4, 1, None, plain, 0, 100, name="GET /health"),
        _span(4, 2, 1, {"db.system": "postgresql"}, 10, 20, name="SELECT")])
    assert outcome.runs_written == 3 and outcome.rejected == 0
    (run,) = _runs(db, 1)
    assert (run.status, run.agent_id, run.input) == ("succeeded", "handle", "what is up?")
    with db.read() as s:
        messages = s.execute(select(Message.role, Message.content)
                             .where(Message.session_id == run.session_id)
                             .order_by(Message.created_at)).all()
        assert s.get(ChatSession, run.session_id).title == "chat-42"
    assert [tuple(m) for m in messages] == [("user", "what is up?"), ("assistant", "all good")]
    (chain,) = _runs(db, 2)
    assert (chain.input, chain.session_id) == ("summarise", None)
    with db.read() as s:
        assert s.get(Message, chain.final_message_id).content == "done"
    (genai,) = _runs(db, 3)
    assert genai.input == "hello" and genai.status == "succeeded"
    # A plain HTTP trace is kept, waiting, and never becomes a run.
    assert _runs(db, 4) == []
    with db.read() as s:
        assert set(s.execute(select(OtlpSpan.run_id).where(
            OtlpSpan.trace_id == f"{4:032x}")).scalars()) == {None}
    assert_chains_ok(db)


def test_a_nameless_agent_span_is_a_run_filed_under_its_span_name_else_its_service(db):
    named = {"openinference.span.kind": "AGENT", "agent.name": "Planner", "input.value": "go"}
    nameless = {"openinference.span.kind": "AGENT", "input.value": "dig"}
    nameless_genai = {"gen_ai.operation.name": "invoke_agent"}
    spans = [_span(1, 1, None, named, 0, 100, name="Planner"),
             _span(1, 2, 1, nameless, 10, 40, name="research step"),
             _span(1, 3, 2, {"openinference.span.kind": "LLM", "llm.token_count.prompt": 4,
                             "llm.token_count.completion": 1, "output.value": "found"}, 15, 30),
             _span(1, 4, 1, nameless, 50, 60, name=""),
             _span(1, 5, 1, nameless_genai, 70, 80, name="invoke_agent", service="books-svc")]
    assert receive_spans(db, OWNER, spans).runs_written == 4
    root, *children = _runs(db, 1)
    assert root.agent_id == "planner" and root.parent_run_id is None
    assert [(c.agent_id, c.parent_run_id, c.session_id) for c in children] == [
        ("research-step", root.id, None), ("svc", root.id, None), ("books-svc", root.id, None)]
    assert [t for t, _ in _events(db, root.id)].count("run.child_created") == 3
    assert ("usage", {"input_tokens": 4, "output_tokens": 1, "cost_usd": None}) in _events(
        db, children[0].id)
    assert_chains_ok(db)


def test_a_nameless_agent_span_above_named_agents_is_only_their_workflow(db):
    """The OpenAI Agents instrumentation's workflow span: its agents are the root runs. Without
    a named agent under it, a nameless top AGENT span is the agent itself."""
    workflow = {"openinference.span.kind": "AGENT"}
    agent = {"openinference.span.kind": "AGENT", "agent.name": "weather", "input.value": "hi",
             "output.value": "sunny"}
    llm = {"openinference.span.kind": "LLM", "llm.model_name": "m-1", "output.value": "sunny"}
    spans = [_span(1, 1, None, workflow, 0, 100, name="Agent workflow"),
             _span(1, 2, 1, agent, 10, 90, name="weather"),
             _span(1, 3, 2, llm, 20, 80),
             _span(2, 1, None, workflow, 0, 100, name="AgentExecutor"),
             _span(2, 2, 1, llm, 20, 80)]
    assert receive_spans(db, OWNER, spans).runs_written == 2
    (run,) = _runs(db, 1)
    assert (run.agent_id, run.parent_run_id) == ("weather", None)
    (alone,) = _runs(db, 2)
    assert alone.agent_id == "agentexecutor"
    assert_chains_ok(db)


# ---- run.started ------------------------------------------------------------------------------


def test_run_started_carries_the_executor_and_a_lease_ending_with_the_agent_span(db):
    spans = [_span(1, 1, None, _agent(**{"gen_ai.agent.name": "lead"}), 0, 100, service="app"),
             _span(1, 2, 1, _agent(**{"gen_ai.agent.name": "helper"}), 20, 70, service="app")]
    assert receive_spans(db, OWNER, spans).runs_written == 2
    root, child = _runs(db, 1)
    for run, end_ms in ((root, 100), (child, 70)):
        end = T0 + timedelta(milliseconds=end_ms)
        started = next(data for kind, data in _events(db, run.id) if kind == "run.started")
        assert started == {"executor_instance_id": "otlp:app",
                           "lease_expires_at": end.isoformat()}
        assert run.lease_expires_at == end == run.finished_at
    assert_chains_ok(db)
