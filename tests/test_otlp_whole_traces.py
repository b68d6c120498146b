"""An OTLP export of whole new traces (``ingest.otlp.record``): its spans are stored already
claimed by their runs, in the transaction that writes the runs. When a span of those traces is
stored already, or is stored meanwhile, the export takes the general path, and every span ends
either recorded in a run or reported back as rejected, exactly once.

On SQLite and PostgreSQL. The races run on PostgreSQL, where two servers store spans of one
trace at the same time: the tests make the other request act from inside the spy that sees the
whole-trace write's statements."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import event, select
from support.ledger import assert_chains_ok
from support.statements import statements_sent

from agentledger.core.schema import AgentRun, OtlpSpan
from ingest.otlp import flush_quiet_traces, receive_spans
from ingest.otlp.record import NOT_RECORDED
from ingest.otlp.wire import ReceivedSpan

T0 = datetime(2026, 12, 1, 9, tzinfo=UTC)
AGENT = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner",
         "input.value": "plan a trip", "output.value": "planned"}
CHAT = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m-1",
        "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5}
TOOL = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.arguments": '{"q": 1}', "gen_ai.tool.call.result": "1"}
COUNTS = "count(*) AS n"  # the statement that counts a trace's stored spans (PostgreSQL)


def _span(trace: str, span_id: str, parent: str | None, attrs: dict, start_ms: int,
          end_ms: int) -> ReceivedSpan:
    return ReceivedSpan(trace, span_id, parent, "svc", attrs["gen_ai.operation.name"],
                        T0 + timedelta(milliseconds=start_ms), T0 + timedelta(milliseconds=end_ms),
                        0, None, attrs)


def whole_trace(trace: str) -> list[ReceivedSpan]:
    """An agent span with a model call and a tool call under it: a whole trace."""
    return [_span(trace, "a" * 16, None, AGENT, 0, 100),
            _span(trace, "b" * 16, "a" * 16, CHAT, 10, 20),
            _span(trace, "c" * 16, "a" * 16, TOOL, 30, 40)]


def second_call(trace: str) -> ReceivedSpan:
    """Another model call under the agent span, sent on its own."""
    return _span(trace, "d" * 16, "a" * 16, CHAT, 50, 60)


def trace_id(n: int) -> str:
    return f"{n:032x}"


def claims(db, trace: str) -> dict[str, str | None]:
    with db.read() as s:
        return dict(s.execute(select(OtlpSpan.span_id, OtlpSpan.run_id)
                              .where(OtlpSpan.trace_id == trace)).tuples().all())


def the_run(db, run_id: str) -> AgentRun:
    with db.read() as s:
        run = s.execute(select(AgentRun).where(AgentRun.id == run_id)).scalar_one()
        s.expunge(run)
        return run


def test_whole_new_traces_go_in_claimed_with_their_runs_in_one_transaction(db):
    receive_spans(db, "alice", whole_trace(trace_id(1)))  # the agent is registered by now
    commits = []

    def committed(conn) -> None:
        commits.append(conn)

    event.listen(db.engine, "commit", committed)
    try:
        with statements_sent(db) as sent:
            outcome = receive_spans(db, "alice",
                                    whole_trace(trace_id(2)) + whole_trace(trace_id(3)))
    finally:
        event.remove(db.engine, "commit", committed)
    assert (outcome.new, outcome.runs_written, outcome.rejected) == (6, 2, 0)
    assert len(commits) == 1
    assert not [q for q in sent if q.lstrip().upper().startswith("UPDATE")], sent
    assert len([q for q in sent if "INSERT INTO otlp_span" in q]) == 1
    for trace in (trace_id(2), trace_id(3)):
        owners = set(claims(db, trace).values())
        assert len(owners) == 1 and None not in owners and NOT_RECORDED not in owners
        run = the_run(db, owners.pop())
        assert run.status == "succeeded" and run.usage_input_tokens == 10
    assert_chains_ok(db)


def test_a_trace_with_a_span_stored_before_takes_the_general_path(db):
    trace = trace_id(11)
    alone = receive_spans(db, "alice", [second_call(trace)])
    assert (alone.new, alone.runs_written, alone.rejected) == (1, 0, 0)
    assert claims(db, trace) == {"d" * 16: None}  # waits for its agent span
    outcome = receive_spans(db, "alice", whole_trace(trace))
    assert (outcome.new, outcome.runs_written, outcome.rejected) == (3, 1, 0)
    owners = claims(db, trace)
    assert len(owners) == 4 and len(set(owners.values())) == 1
    assert the_run(db, owners["a" * 16]).usage_input_tokens == 20  # both model calls
    again = receive_spans(db, "alice", whole_trace(trace))
    assert (again.new, again.runs_written, again.rejected) == (0, 0, 0)
    assert_chains_ok(db)


def test_an_attribute_beyond_64_bits_is_stored_as_sent(db):
    trace = trace_id(21)
    spans = whole_trace(trace)
    big = {**CHAT, "app.request_number": 2**70}
    spans[1] = _span(trace, "b" * 16, "a" * 16, big, 10, 20)
    assert receive_spans(db, "alice", spans).runs_written == 1
    with db.read() as s:
        stored = s.execute(select(OtlpSpan.attributes).where(
            OtlpSpan.trace_id == trace, OtlpSpan.span_id == "b" * 16)).scalar_one()
    assert json.loads(json.dumps(stored))["app.request_number"] == 2**70


def _on_statement(db, thread: int, match: str, nth: int, act):
    """A ``statements_sent`` hook: ``act()`` just before the ``nth`` statement containing
    ``match`` that ``thread`` sends."""
    seen = []

    def before(sql: str) -> None:
        if threading.get_ident() == thread and match in sql:
            seen.append(sql)
            if len(seen) == nth:
                act()
    return before


def test_a_span_stored_before_the_count_makes_the_whole_trace_write_step_aside(pg_db):
    """Another server stores a span of the trace after this export's check found none, and
    commits before the count: the export writes nothing itself and takes the general path,
    whose tree holds that span too."""
    db, trace = pg_db, trace_id(31)
    receive_spans(db, "alice", whole_trace(trace_id(30)))
    other = []
    hook = _on_statement(db, threading.get_ident(), "INSERT INTO otlp_span", 1,
                         lambda: other.append(_in_thread(db, [second_call(trace)]).result()))
    with statements_sent(db, before=hook):
        outcome = receive_spans(db, "alice", whole_trace(trace))
    assert other and (other[0].new, other[0].rejected) == (1, 0)
    assert (outcome.new, outcome.runs_written, outcome.rejected) == (3, 1, 0)
    owners = claims(db, trace)
    assert len(owners) == 4 and len(set(owners.values())) == 1
    assert the_run(db, owners["a" * 16]).usage_input_tokens == 20
    assert_chains_ok(db)


def test_a_span_sent_while_the_whole_trace_is_written_waits_and_is_reported_late(pg_db):
    """Another server stores a span of the trace after the count: its request waits for the
    trace's lock until the runs are committed, then finds the run recorded and reports the span
    as rejected (kept, not recorded), as when it arrives after the run."""
    db, trace = pg_db, trace_id(41)
    receive_spans(db, "alice", whole_trace(trace_id(40)))
    other = []

    def send_and_wait():
        other.append(_in_thread(db, [second_call(trace)]))
        other[0].thread.join(timeout=1.0)
        other.append(other[0].thread.is_alive())  # still waiting while the write is open

    hook = _on_statement(db, threading.get_ident(), COUNTS, 2, send_and_wait)
    with statements_sent(db, before=hook):
        outcome = receive_spans(db, "alice", whole_trace(trace))
    assert (outcome.new, outcome.runs_written, outcome.rejected) == (3, 1, 0)
    assert other[1] is True
    late = other[0].result()
    assert (late.new, late.runs_written, late.rejected) == (1, 0, 1)
    owners = claims(db, trace)
    assert owners["d" * 16] == NOT_RECORDED
    assert the_run(db, owners["a" * 16]).usage_input_tokens == 10
    assert_chains_ok(db)


class _in_thread:
    """``receive_spans`` in another thread (another server's request)."""

    def __init__(self, db, spans):
        self.outcome = None
        self.thread = threading.Thread(target=self._run, args=(db, spans))
        self.thread.start()

    def _run(self, db, spans):
        self.outcome = receive_spans(db, "alice", spans)

    def result(self):
        self.thread.join(timeout=30)
        assert self.outcome is not None
        return self.outcome


# ---- a settle period: spans of a trace in any order, the top agent span first included -------


def _events_of(db, run_id: str) -> list[str]:
    from agentledger.core.schema import RunEvent

    with db.read() as s:
        return list(s.execute(select(RunEvent.type).where(RunEvent.run_id == run_id)
                              .order_by(RunEvent.seq)).scalars())


def _root_run(db, trace: str) -> str | None:
    return claims(db, trace).get("a" * 16)


def test_without_a_settle_period_a_top_agent_span_sent_first_is_recorded_at_once(db):
    """The default: a top agent span whose chain is complete (here the trace's root) is
    written when it arrives; its model and tool spans sent afterwards are late."""
    trace = trace_id(40)
    root, chat, tool = whole_trace(trace)
    assert receive_spans(db, "alice", [root]).runs_written == 1
    late = receive_spans(db, "alice", [chat, tool])
    assert late.runs_written == 0 and late.rejected == 2
    assert _events_of(db, _root_run(db, trace)) == ["run.queued", "run.started",
                                                     "run.completed"]


def test_with_a_settle_period_spans_in_any_order_make_one_whole_run(db):
    """``settle_seconds``: nothing is written as spans arrive; once the trace received nothing
    for that long the reconciler's flush writes it whole, whichever span came first."""
    first_root, last_root = trace_id(41), trace_id(42)
    root, chat, tool = whole_trace(first_root)
    for batch in ([root], [tool], [chat]):  # the top agent span first
        assert receive_spans(db, "alice", batch, settle_seconds=0.5).runs_written == 0
    root2, chat2, tool2 = whole_trace(last_root)
    assert receive_spans(db, "alice", [chat2, tool2, root2],  # a whole trace in one export
                         settle_seconds=0.5).runs_written == 0
    assert flush_quiet_traces(db, settle_seconds=5) == 0  # not quiet that long yet
    assert _root_run(db, first_root) is None
    time.sleep(0.6)
    assert flush_quiet_traces(db, settle_seconds=0.5) == 2
    for trace in (first_root, last_root):
        run_id = _root_run(db, trace)
        assert set(claims(db, trace).values()) == {run_id}
        assert _events_of(db, run_id) == ["run.queued", "run.started", "usage", "tool.call",
                                          "tool.result", "run.completed"]
    assert flush_quiet_traces(db, settle_seconds=0.5) == 0  # written once
    late = receive_spans(db, "alice", [second_call(first_root)], settle_seconds=0.5)
    assert late.rejected == 1  # after the run was written: late, as without a settle period
    assert_chains_ok(db)


def test_a_settled_trace_missing_its_root_waits_for_the_quiet_period(db):
    """A settle period writes complete trees only; a top agent span whose parent never came
    waits, as without one, until the trace is quiet (then it is a root run)."""
    trace = trace_id(43)
    orphan = _span(trace, "e" * 16, "f" * 16, AGENT, 0, 100)  # its parent never arrives
    assert receive_spans(db, "alice", [orphan], settle_seconds=0.2).runs_written == 0
    time.sleep(0.3)
    assert flush_quiet_traces(db, settle_seconds=0.2, quiet_seconds=30) == 0
    assert flush_quiet_traces(db, settle_seconds=0.2, quiet_seconds=0.25) == 1
