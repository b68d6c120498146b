"""The OTLP/HTTP trace receiver (CONTRACT §8) behind a real ``agentledger serve`` process, fed by
the real OpenTelemetry SDK and its OTLP/HTTP protobuf exporter, by a real Pydantic AI agent
(TestModel, native instrumentation), by a real OpenAI Agents SDK run (a fake ``Model``
subclass, OpenInference instrumentation) and by OTLP JSON built with ``json_format``.
On SQLite and PostgreSQL; ``agentledger verify`` passes over everything written."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import time

import pytest
import requests
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from sqlalchemy import func, select
from support.api import STANDARD_TOKENS, ServerProcess, make_tokens, wait_until

from agentledger.core.database import Database
from agentledger.core.schema import AgentRun, AgentVersion, ChatSession, Message, OtlpSpan, RunEvent

pytestmark = pytest.mark.timeout(180)
TRACES = "/api/otel/v1/traces"


@pytest.fixture(scope="module")
def world(module_db_url, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("otlp")
    servers = [ServerProcess(module_db_url, workdir), ServerProcess(module_db_url, workdir)]
    db = Database(module_db_url)
    tokens = make_tokens(db, STANDARD_TOKENS)
    try:
        yield {"servers": servers, "db": db, "tokens": tokens, "url": module_db_url}
    finally:
        for server in servers:
            server.stop()
        db.dispose()


def provider(world, *, server: int = 0, token: str | None = None,
             service: str = "test-svc") -> TracerProvider:
    """A real TracerProvider exporting (synchronously) with the real OTLP/HTTP protobuf exporter."""
    base = world["servers"][server].base_url
    exporter = OTLPSpanExporter(endpoint=base + TRACES,
                                headers={"Authorization": f"Bearer {token or world['tokens']['executor']}"})
    tp = TracerProvider(resource=Resource.create({"service.name": service}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp


def runs_of(db, trace_id: str) -> list[AgentRun]:
    with db.read() as s:
        run_ids = s.execute(select(OtlpSpan.run_id).where(
            OtlpSpan.trace_id == trace_id, OtlpSpan.run_id.is_not(None),
            OtlpSpan.run_id != "")).scalars().all()
        rows = s.execute(select(AgentRun).where(AgentRun.id.in_(set(run_ids)))
                         .order_by(AgentRun.created_at)).scalars().all()
        s.expunge_all()
        return list(rows)


def events_of(db, run_id: str) -> list[tuple[str, dict]]:
    with db.read() as s:
        return [(e.type, e.data) for e in s.execute(
            select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.seq)).scalars()]


def answer_of(db, run: AgentRun) -> str | None:
    with db.read() as s:
        return s.execute(select(Message.content).where(Message.id == run.final_message_id)).scalar()


def counts(db) -> tuple[int, int, int]:
    with db.read() as s:
        return (s.execute(select(func.count()).select_from(OtlpSpan)).scalar_one(),
                s.execute(select(func.count()).select_from(AgentRun)).scalar_one(),
                s.execute(select(func.count()).select_from(RunEvent)).scalar_one())


def verify(world) -> None:
    env = {**os.environ, "AGENTLEDGER_DATABASE_URL": world["url"]}
    done = subprocess.run([sys.executable, "-m", "agentledger.cli", "verify"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def post(world, body: bytes, content_type: str = "application/x-protobuf", *, token="executor",
         server: int = 0, headers=None) -> requests.Response:
    all_headers = {"Content-Type": content_type, **(headers or {})}
    if token is not None:
        all_headers["Authorization"] = f"Bearer {world['tokens'].get(token, token)}"
    return requests.post(world["servers"][server].base_url + TRACES, data=body,
                         headers=all_headers, timeout=60)


# ---- building exports by hand (for ordering, duplicates and errors) ----------------------------

_T0 = 1_780_000_000_000_000_000


def _attr(key, value):
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def span(trace: str, span_id: str, parent: str | None, name: str, start: int, end: int,
         attrs: dict, *, error: str | None = None) -> dict:
    out = {"traceId": trace, "spanId": span_id, "name": name, "kind": 1,
           "startTimeUnixNano": str(_T0 + start * 1_000_000),
           "endTimeUnixNano": str(_T0 + end * 1_000_000),
           "attributes": [_attr(k, v) for k, v in attrs.items()]}
    if parent:
        out["parentSpanId"] = parent
    if error is not None:
        out["status"] = {"code": 2, "message": error}
    return out


def export_json(spans: list[dict], service: str = "hand-svc") -> dict:
    return {"resourceSpans": [{"resource": {"attributes": [_attr("service.name", service)]},
                               "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}


def as_protobuf(payload: dict) -> bytes:
    """The same export as protobuf: OTLP JSON's hex ids converted the way ``wire`` does."""
    from ingest.otlp.wire import _hex_ids_to_base64

    copy = json.loads(json.dumps(payload))
    _hex_ids_to_base64(copy)
    return json_format.ParseDict(copy, ExportTraceServiceRequest()).SerializeToString()


def tree_spans(trace: str, *, conversation: str | None = None) -> dict[str, dict]:
    """A root agent with one model call, one tool call and a delegated child agent."""
    conv = {"gen_ai.conversation.id": conversation} if conversation else {}
    return {
        "root": span(trace, "a" * 16, None, "invoke_agent planner", 0, 100, {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner",
            "gen_ai.request.model": "m-1", **conv,
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [
                {"type": "text", "content": "plan a trip"}]}]),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                {"type": "text", "content": "trip planned"}]}])}),
        "chat": span(trace, "b" * 16, "a" * 16, "chat m-1", 5, 20, {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "m-1",
            "gen_ai.usage.input_tokens": 11, "gen_ai.usage.output_tokens": 7}),
        "tool": span(trace, "c" * 16, "a" * 16, "execute_tool lookup", 21, 30, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
            "gen_ai.tool.call.id": "call-9", "gen_ai.tool.call.arguments": '{"q": "x"}',
            "gen_ai.tool.call.result": '{"a": 1}'}),
        "child": span(trace, "d" * 16, "a" * 16, "invoke_agent booker", 40, 90, {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "booker"}),
        "child_chat": span(trace, "e" * 16, "d" * 16, "chat m-2", 45, 80, {
            "gen_ai.operation.name": "chat", "gen_ai.response.model": "m-2",
            "gen_ai.usage.input_tokens": 3, "gen_ai.usage.output_tokens": 2,
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                {"type": "text", "content": "booked"}]}])}),
    }


def new_trace() -> str:
    return os.urandom(16).hex()


# ---- tests -------------------------------------------------------------------------------------


def test_sdk_exporter_protobuf_run_tree_usage_tool_and_answer(world):
    db = world["db"]
    tp = provider(world, service="checkout")
    tracer = tp.get_tracer("test")
    with tracer.start_as_current_span("invoke_agent helper", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "SDK Helper",
            "input.value": "what is 2+2?", "output.value": "4"}) as root:
        trace_id = format(root.get_span_context().trace_id, "032x")
        with tracer.start_as_current_span("chat", attributes={
                "gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny",
                "gen_ai.usage.input_tokens": 5, "gen_ai.usage.output_tokens": 1}):
            pass
        with tracer.start_as_current_span("execute_tool add", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "add",
                "gen_ai.tool.call.id": "c1", "gen_ai.tool.call.arguments": '{"a": 2, "b": 2}',
                "gen_ai.tool.call.result": "4"}):
            pass
    tp.shutdown()
    assert wait_until(lambda: len(runs_of(db, trace_id)) == 1, timeout=30)
    (run,) = runs_of(db, trace_id)
    assert run.status == "succeeded" and run.session_id is None
    assert run.parent_run_id is None and run.root_run_id == run.id
    assert run.executor_instance_id == "otlp:checkout"
    assert run.agent_id == "sdk-helper"
    assert run.input == "what is 2+2?"
    assert answer_of(db, run) == "4"
    types = [t for t, _ in events_of(db, run.id)]
    assert types == ["run.queued", "run.started", "usage", "tool.call", "tool.result",
                     "run.completed"]
    usage = dict(events_of(db, run.id))["usage"]
    assert usage == {"input_tokens": 5, "output_tokens": 1, "cost_usd": None, "model": "tiny"}
    call = dict(events_of(db, run.id))["tool.call"]
    assert call == {"name": "add", "input": {"a": 2, "b": 2}, "call_id": "c1"}
    with db.read() as s:
        kind = s.execute(select(AgentVersion.kind).where(AgentVersion.agent_id == "sdk-helper")).scalar()
    assert kind == "external"
    verify(world)


def test_child_runs_sessions_and_failure_from_otlp_json(world):
    db = world["db"]
    trace = new_trace()
    conversation = "conv-" + trace[:8]
    spans = tree_spans(trace, conversation=conversation)
    reply = post(world, json.dumps(export_json(list(spans.values()))).encode(), "application/json")
    assert reply.status_code == 200, reply.text
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.json() == {}
    runs = runs_of(db, trace)
    assert len(runs) == 2
    root = next(r for r in runs if r.parent_run_id is None)
    child = next(r for r in runs if r.parent_run_id is not None)
    assert child.parent_run_id == root.id and child.root_run_id == root.id
    assert child.session_id is None and child.thread_id != root.thread_id
    assert root.session_id is not None
    assert answer_of(db, root) == "trip planned" and answer_of(db, child) == "booked"
    assert [t for t, _ in events_of(db, root.id)] == [
        "run.queued", "run.started", "usage", "tool.call", "tool.result", "run.child_created",
        "run.child_finished", "run.completed"]
    # A second trace of the same conversation joins the same session; its run fails.
    trace2 = new_trace()
    failing = span(trace2, "f" * 16, None, "invoke_agent planner", 200, 300, {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner",
        "gen_ai.request.model": "m-1", "gen_ai.conversation.id": conversation,
        "error.type": "TimeoutError", "input.value": "again"}, error="model timed out")
    assert post(world, as_protobuf(export_json([failing]))).status_code == 200
    (failed,) = runs_of(db, trace2)
    assert failed.status == "failed" and failed.session_id == root.session_id
    assert failed.error == {"code": "TimeoutError", "message": "model timed out"}
    assert failed.thread_id == root.thread_id
    with db.read() as s:
        chat = s.get(ChatSession, root.session_id)
        assert chat.owner_id == STANDARD_TOKENS["executor"][0]
        users = s.execute(select(Message.content).where(
            Message.session_id == root.session_id, Message.role == "user")
            .order_by(Message.created_at)).scalars().all()
    assert users == ["plan a trip", "again"]
    verify(world)


def test_reexport_records_nothing_new(world):
    db = world["db"]
    trace = new_trace()
    body = as_protobuf(export_json(list(tree_spans(trace).values())))
    assert post(world, body).status_code == 200
    before = counts(db)
    for server in (0, 1):
        reply = post(world, body, server=server)
        assert reply.status_code == 200
        parsed = ExportTraceServiceResponse.FromString(reply.content)
        assert parsed.partial_success.rejected_spans == 0
    assert counts(db) == before


def test_out_of_order_delivery_across_two_servers(world):
    """Child spans first (server 0), the root in a later request (server 1): one tree."""
    db = world["db"]
    trace = new_trace()
    spans = tree_spans(trace)
    first = [spans["child_chat"], spans["child"], spans["tool"]]
    second = [spans["chat"], spans["root"]]
    assert post(world, as_protobuf(export_json(first)), server=0).status_code == 200
    assert runs_of(db, trace) == []
    reply = post(world, gzip.compress(as_protobuf(export_json(second))), server=1,
                 headers={"Content-Encoding": "gzip"})
    assert reply.status_code == 200, reply.text
    runs = runs_of(db, trace)
    assert len(runs) == 2 and {r.status for r in runs} == {"succeeded"}
    # A span of the tree arriving after it was recorded is kept and reported, not recorded.
    late = span(trace, "9" * 16, "a" * 16, "execute_tool late", 95, 99, {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "late"})
    reply = post(world, json.dumps(export_json([late])).encode(), "application/json")
    assert reply.status_code == 200
    assert reply.json()["partialSuccess"]["rejectedSpans"] in (1, "1")
    assert len(runs_of(db, trace)) == 2
    verify(world)


def test_concurrent_halves_of_one_trace_on_two_servers_write_it_once(world):
    """Both halves at the same time: the root run is written exactly once, and every span is
    either recorded in a run or reported back as rejected (a child agent span that lost the race
    with its root's write is kept, not recorded)."""
    import threading

    db = world["db"]
    for _ in range(4):
        trace = new_trace()
        spans = list(tree_spans(trace).values())
        halves = [spans[:3], spans[2:]]
        replies = {}
        threads = [threading.Thread(target=lambda i=i, out=replies, parts=halves: out.__setitem__(
            i, post(world, as_protobuf(export_json(parts[i])), server=i))) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [replies[i].status_code for i in (0, 1)] == [200, 200]
        runs = runs_of(db, trace)
        assert [r.parent_run_id for r in runs].count(None) == 1
        rejected = sum(ExportTraceServiceResponse.FromString(replies[i].content)
                       .partial_success.rejected_spans for i in (0, 1))
        with db.read() as s:
            recorded = s.execute(select(func.count()).select_from(OtlpSpan).where(
                OtlpSpan.trace_id == trace, OtlpSpan.run_id != "")).scalar_one()
        assert recorded + rejected == len(spans)
        if len(runs) == 2:
            assert rejected == 0
    verify(world)


def test_bad_requests_are_refused_and_write_nothing(world):
    db = world["db"]
    good = as_protobuf(export_json(list(tree_spans(new_trace()).values())))
    before = counts(db)
    cases = [
        (post(world, b"\xff\xff\xff not protobuf"), 400, "invalid_request"),
        (post(world, b"{not json", "application/json"), 400, "invalid_request"),
        (post(world, b'{"resourceSpans": 5}', "application/json"), 400, "invalid_request"),
        (post(world, b"[" * 50_000 + b"]" * 50_000, "application/json"), 400, "invalid_request"),
        (post(world, b'{"resourceSpans": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
              "application/json"), 400, "invalid_request"),
        (post(world, b"not gzip", headers={"Content-Encoding": "gzip"}), 400, "invalid_request"),
        (post(world, good, "text/plain"), 415, "unsupported_media_type"),
        (post(world, good, token=None), 401, "unauthenticated"),
        (post(world, good, token="not-a-token"), 401, "unauthenticated"),
        (post(world, good, token="alice"), 403, "forbidden"),
        (post(world, good, token="viewer"), 403, "forbidden"),
        (post(world, b"\0" * (16 * 1024 * 1024 + 1)), 413, "payload_too_large"),
        (post(world, gzip.compress(b"\0" * (16 * 1024 * 1024 + 1)),
              headers={"Content-Encoding": "gzip"}), 413, "payload_too_large"),
    ]
    for reply, status, code in cases:
        assert reply.status_code == status, (status, reply.text)
        assert reply.json()["error"]["code"] == code
    assert counts(db) == before
    assert post(world, good, token="admin").status_code == 200


def test_pydantic_ai_agent_with_native_instrumentation(world):
    from pydantic_ai import Agent
    from pydantic_ai.models.instrumented import InstrumentationSettings
    from pydantic_ai.models.test import TestModel

    db = world["db"]
    tp = provider(world, service="pydantic-app")
    agent = Agent(TestModel(), name="weather", instructions="be brief")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        return "sunny"

    Agent.instrument_all(InstrumentationSettings(tracer_provider=tp))
    try:
        result = asyncio.run(agent.run("weather in Paris?"))
    finally:
        Agent.instrument_all(False)
        tp.shutdown()
    with db.read() as s:
        spans = s.execute(select(OtlpSpan).where(OtlpSpan.name == "invoke_agent weather")
                          .order_by(OtlpSpan.received_at.desc())).scalars().first()
        trace = spans.trace_id
    (run,) = runs_of(db, trace)
    assert run.status == "succeeded" and run.agent_id == "weather"
    assert run.input == "weather in Paris?"
    assert answer_of(db, run) == result.output
    events = events_of(db, run.id)
    types = [t for t, _ in events]
    assert types.count("usage") == 2 and "tool.call" in types and "tool.result" in types
    call = next(d for t, d in events if t == "tool.call")
    assert call["name"] == "get_weather" and call["call_id"]
    assert run.session_id is not None  # gen_ai.conversation.id
    with db.read() as s:
        version = s.execute(select(AgentVersion).where(AgentVersion.agent_id == "weather")
                            .order_by(AgentVersion.version.desc())).scalars().first()
        assert (version.kind, version.model, version.instructions, version.tools) == (
            "external", "test", "be brief", ["get_weather"])
    verify(world)


def test_openai_agents_sdk_with_openinference(world):
    from agents import Agent, Runner, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.tracing import generation_span
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    db = world["db"]
    tp = provider(world, service="oai-app")

    class FakeModel(Model):
        """Calls the tool once, then answers; records a generation span like real models do."""

        def __init__(self):
            self.calls = 0

        async def get_response(self, system_instructions, input, model_settings, tools,
                               output_schema, handoffs, tracing, **kwargs):
            self.calls += 1
            with generation_span(model="fake-1", input=[{"role": "user", "content": "hi"}]) as gen:
                if self.calls == 1:
                    output = [ResponseFunctionToolCall(type="function_call", id="fc1",
                                                       call_id="call_1", name="get_weather",
                                                       arguments='{"city": "Paris"}')]
                    gen.span_data.output = [{"role": "assistant", "content": ""}]
                else:
                    output = [ResponseOutputMessage(
                        id="m1", type="message", role="assistant", status="completed",
                        content=[ResponseOutputText(type="output_text", text="It is sunny.",
                                                    annotations=[])])]
                    gen.span_data.output = [{"role": "assistant", "content": "It is sunny."}]
                gen.span_data.usage = {"input_tokens": 10, "output_tokens": 4}
            return ModelResponse(output=output, usage=Usage(requests=1, input_tokens=10,
                                                            output_tokens=4, total_tokens=14),
                                 response_id=None)

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError

    @function_tool
    def get_weather(city: str) -> str:
        return "sunny"

    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=tp)
    try:
        agent = Agent(name="weather-oai", instructions="be brief", model=FakeModel(),
                      tools=[get_weather])
        result = asyncio.run(Runner.run(agent, "weather in Paris?"))
    finally:
        instrumentor.uninstrument()
        tp.shutdown()
    assert result.final_output == "It is sunny."
    with db.read() as s:
        trace = s.execute(select(OtlpSpan.trace_id).where(OtlpSpan.name == "weather-oai")
                          .order_by(OtlpSpan.received_at.desc())).scalars().first()
    assert wait_until(lambda: len(runs_of(db, trace)) == 1, timeout=30)
    (run,) = runs_of(db, trace)
    assert run.status == "succeeded" and run.agent_id == "weather-oai"
    assert run.executor_instance_id == "otlp:oai-app"
    assert answer_of(db, run) == "It is sunny."
    events = events_of(db, run.id)
    types = [t for t, _ in events]
    assert types.count("usage") == 2
    assert ("tool.call", {"name": "get_weather", "input": {"city": "Paris"}}) in events
    assert next(d for t, d in events if t == "tool.result")["output"] == "sunny"
    verify(world)


def test_quiet_trace_whose_parent_never_arrives_is_written_as_a_root(world, monkeypatch):
    from ingest.otlp import flush_quiet_traces

    db = world["db"]
    trace = new_trace()
    orphan = span(trace, "1" * 16, "2" * 16, "invoke_agent orphan", 0, 10, {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "orphan",
        "input.value": "hello"})
    assert post(world, as_protobuf(export_json([orphan]))).status_code == 200
    assert runs_of(db, trace) == []
    time.sleep(0.2)
    assert flush_quiet_traces(db, quiet_seconds=0.1) >= 1
    (run,) = runs_of(db, trace)
    assert run.parent_run_id is None and run.status == "succeeded"
    verify(world)


def test_kind_external_registers_but_no_worker_claims_its_runs(world):
    base = world["servers"][0].base_url
    admin = {"Authorization": f"Bearer {world['tokens']['admin']}"}
    reply = requests.post(base + "/api/agents", headers=admin, timeout=30,
                          json={"id": "ext-registered", "name": "Ext", "kind": "external"})
    assert reply.status_code == 201, reply.text
    claim = requests.post(base + "/api/executor/claim", timeout=30,
                          headers={"Authorization": f"Bearer {world['tokens']['executor']}"},
                          json={"executor_instance_id": "otlp-claim-check", "max_runs": 50})
    assert claim.status_code == 200
    assert claim.json()["runs"] == []  # every OTLP run was written terminal


def test_a_settle_period_takes_a_distributed_trace_whose_root_is_exported_first(world, tmp_path):
    """Two services of one trace, each with the real SDK exporter: the front service's agent span
    ends and is exported before the tool service's spans under it (their work outlived it). A
    server with ``AGENTLEDGER_OTLP_SETTLE_SECONDS`` writes one whole run once the trace is quiet;
    one without it writes the root at once and reports the later spans as rejected."""
    from opentelemetry.trace import set_span_in_context

    settling = ServerProcess(world["url"], tmp_path, env={
        "AGENTLEDGER_OTLP_SETTLE_SECONDS": "3", "AGENTLEDGER_RECONCILE_SECONDS": "0.2"})
    try:
        def export(base_url: str) -> tuple[str, list[int]]:
            rejected: list[int] = []

            def count_rejected(reply, *args, **kwargs):
                if reply.ok:
                    rejected.append(ExportTraceServiceResponse.FromString(
                        reply.content).partial_success.rejected_spans)

            session = requests.Session()
            session.hooks["response"].append(count_rejected)

            def provider_for(service: str) -> TracerProvider:
                tp = TracerProvider(resource=Resource.create({"service.name": service}))
                tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
                    endpoint=base_url + TRACES, session=session,
                    headers={"Authorization": f"Bearer {world['tokens']['executor']}"})))
                return tp

            front, tools = provider_for("front"), provider_for("tools")
            with front.get_tracer("t").start_as_current_span("invoke_agent concierge", attributes={
                    "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "Concierge",
                    "input.value": "book a table", "output.value": "booked for 8"}) as root:
                trace_id = format(root.get_span_context().trace_id, "032x")
                tool = tools.get_tracer("t").start_span(
                    "execute_tool reserve", context=set_span_in_context(root), attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "reserve",
                        "gen_ai.tool.call.id": "r1", "gen_ai.tool.call.arguments": '{"at": 8}',
                        "gen_ai.tool.call.result": "ok"})
            tool.end()  # after the root was exported
            front.shutdown()
            tools.shutdown()
            return trace_id, rejected

        db = world["db"]
        trace, rejected = export(settling.base_url)
        assert rejected == [0, 0]
        assert runs_of(db, trace) == []  # waiting for the trace to be quiet
        assert wait_until(lambda: len(runs_of(db, trace)) == 1, timeout=30)
        (run,) = runs_of(db, trace)
        assert run.status == "succeeded" and answer_of(db, run) == "booked for 8"
        assert [t for t, _ in events_of(db, run.id)] == [
            "run.queued", "run.started", "tool.call", "tool.result", "run.completed"]

        trace, rejected = export(world["servers"][0].base_url)
        assert rejected == [0, 1]
        (run,) = runs_of(db, trace)
        assert [t for t, _ in events_of(db, run.id)] == [
            "run.queued", "run.started", "run.completed"]
        verify(world)
    finally:
        settling.stop()
