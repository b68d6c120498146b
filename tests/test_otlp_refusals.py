"""OTLP spans whose runs the ledger cannot record (``ingest.otlp.record``): a count beyond what a
usage event holds, a model name longer than an agent version holds. Such a run tree is refused
on its own: its spans are kept, marked not recorded and reported back as rejected, while the
other traces of the export are recorded; nothing of the refused tree is written (no agent, no
session), and the quiet-trace flush never looks at it again. Attribute text that holds JSON the
ledger cannot store is kept as the text that was sent.

On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from support.ledger import assert_chains_ok

from agentledger.core.schema import (
    Agent,
    AgentRun,
    ChatSession,
    OtlpConversation,
    OtlpSpan,
    RunEvent,
)
from ingest.otlp import flush_quiet_traces, receive_spans
from ingest.otlp.record import MAX_RUN_DEPTH, NOT_RECORDED
from ingest.otlp.wire import ReceivedSpan, decode_export, spans_of

T0 = datetime(2026, 12, 1, 9, tzinfo=UTC)
TOO_MANY = 2 * 10**12  # above what a usage event counts (10^12 tokens)


def _agent(name: str, **extra) -> dict:
    return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name,
            "input.value": "hello", "output.value": "done", **extra}


def _chat(tokens: int = 10, model: str = "m-1") -> dict:
    return {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": tokens, "gen_ai.usage.output_tokens": 5}


def _tool(arguments: str) -> dict:
    return {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
            "gen_ai.tool.call.arguments": arguments, "gen_ai.tool.call.result": "1"}


def _span(trace: str, span_id: str, parent: str | None, attrs: dict, start_ms: int = 0,
          end_ms: int = 100, service: str = "svc") -> ReceivedSpan:
    return ReceivedSpan(trace, span_id, parent, service, attrs["gen_ai.operation.name"],
                        T0 + timedelta(milliseconds=start_ms), T0 + timedelta(milliseconds=end_ms),
                        0, None, attrs)


def _trace(n: int) -> str:
    return f"{n:032x}"


def _tree(trace: str, agent: str, chat: dict, **agent_extra) -> list[ReceivedSpan]:
    return [_span(trace, "a" * 16, None, _agent(agent, **agent_extra)),
            _span(trace, "b" * 16, "a" * 16, chat, 10, 20)]


def _claims(db, trace: str) -> dict[str, str | None]:
    with db.read() as s:
        return dict(s.execute(select(OtlpSpan.span_id, OtlpSpan.run_id)
                              .where(OtlpSpan.trace_id == trace)).tuples().all())


def _count(db, table) -> int:
    with db.read() as s:
        return s.execute(select(func.count()).select_from(table)).scalar_one()


def _agent_ids(db) -> set[str]:
    with db.read() as s:
        return set(s.execute(select(Agent.id)).scalars())


def test_a_tree_the_ledger_refuses_is_rejected_and_the_rest_of_the_export_recorded(db):
    good, bad = _trace(1), _trace(2)
    sessions = (_count(db, ChatSession), _count(db, OtlpConversation))
    export = (_tree(good, "fine-agent", _chat())
              + _tree(bad, "greedy-agent", _chat(TOO_MANY), **{"gen_ai.conversation.id": "c-9"}))
    outcome = receive_spans(db, "alice", export)
    assert (outcome.new, outcome.runs_written, outcome.rejected) == (4, 1, 2)
    assert "input_tokens" in outcome.error_message and bad in outcome.error_message
    assert set(_claims(db, bad).values()) == {NOT_RECORDED}  # kept, never recorded
    (run_id,) = set(_claims(db, good).values())
    with db.read() as s:
        assert s.execute(select(AgentRun.status).where(AgentRun.id == run_id)).scalar() == (
            "succeeded")
    # Nothing of the refused tree was written: not its agent, not its conversation's session.
    assert "greedy-agent" not in _agent_ids(db) and "fine-agent" in _agent_ids(db)
    assert (_count(db, ChatSession), _count(db, OtlpConversation)) == sessions
    again = receive_spans(db, "alice", export)  # a re-export: nothing new, nothing recorded
    assert (again.new, again.runs_written) == (0, 0)
    assert_chains_ok(db)


def test_a_refused_tree_sent_in_pieces_never_holds_back_other_traces(db):
    """The refused tree's first span waited (its agent span had not come); the export that
    completes it reports its own span rejected and marks the waiting one too. A refused tree
    that only the quiet-trace flush can write (its parent never came) is refused there, and
    the flush goes on to the healthy trace beside it."""
    pieces, orphans, healthy = _trace(11), _trace(12), _trace(13)
    agent, chat = _tree(pieces, "piecemeal-agent", _chat(TOO_MANY))
    first = receive_spans(db, "alice", [chat])
    assert (first.new, first.runs_written, first.rejected) == (1, 0, 0)
    second = receive_spans(db, "alice", [agent])
    assert (second.new, second.runs_written, second.rejected) == (1, 0, 1)
    assert "input_tokens" in second.error_message
    assert set(_claims(db, pieces).values()) == {NOT_RECORDED}

    # Two traces whose top agent span lost its parent: they wait for the quiet period.
    bad_orphan = [_span(orphans, "c" * 16, "f" * 16, _agent("orphan-greedy")),
                  _span(orphans, "d" * 16, "c" * 16, _chat(TOO_MANY), 10, 20)]
    good_orphan = [_span(healthy, "c" * 16, "f" * 16, _agent("orphan-fine")),
                   _span(healthy, "d" * 16, "c" * 16, _chat(), 10, 20)]
    waiting = receive_spans(db, "alice", bad_orphan + good_orphan)
    assert (waiting.new, waiting.runs_written, waiting.rejected) == (4, 0, 0)
    assert flush_quiet_traces(db, quiet_seconds=0) == 1  # the healthy one
    assert set(_claims(db, orphans).values()) == {NOT_RECORDED}
    (run_id,) = set(_claims(db, healthy).values())
    assert run_id
    assert flush_quiet_traces(db, quiet_seconds=0) == 0  # nothing left waiting
    assert "orphan-greedy" not in _agent_ids(db)
    assert_chains_ok(db)


def test_a_model_name_longer_than_an_agent_version_holds_refuses_the_tree(db):
    trace = _trace(21)
    agents = _agent_ids(db)
    outcome = receive_spans(db, "alice", _tree(trace, "wordy-agent", _chat(model="m" * 201)))
    assert (outcome.runs_written, outcome.rejected) == (0, 2)
    assert "longer than 200 characters" in outcome.error_message
    assert _agent_ids(db) == agents
    fits = receive_spans(db, "alice", _tree(_trace(22), "wordy-agent", _chat(model="m" * 200)))
    assert (fits.runs_written, fits.rejected) == (1, 0)


def test_a_service_name_the_database_cannot_store_refuses_the_span(db):
    spans = [_span(_trace(31), "a" * 16, None, _agent("nul-service"), service="svc\x00x")]
    outcome = receive_spans(db, "alice", spans)
    assert (outcome.new, outcome.rejected) == (0, 1)
    assert "service.name" in outcome.error_message
    assert _claims(db, _trace(31)) == {}


def test_attribute_json_the_ledger_cannot_store_is_kept_as_the_text_sent(db):
    """Tool arguments spelling NaN, an infinity or NUL, or nested beyond any limit, are not
    JSON either database keeps: the run records them as the text that was sent."""
    sent = ["[NaN]", "[1e999]", '{"a": "\\u0000"}', "[" * 100_000 + "]" * 100_000,
            '{"q": [1, 2]}']
    trace = _trace(41)
    spans = [_span(trace, "a" * 16, None, _agent("odd-arguments"))]
    spans += [_span(trace, f"{n + 1:016x}", "a" * 16, _tool(arguments), 10 + n, 11 + n)
              for n, arguments in enumerate(sent)]
    outcome = receive_spans(db, "alice", spans)
    assert (outcome.runs_written, outcome.rejected) == (1, 0)
    (run_id,) = set(_claims(db, trace).values())
    with db.read() as s:
        inputs = s.execute(select(RunEvent.data).where(
            RunEvent.run_id == run_id, RunEvent.type == "tool.call").order_by(RunEvent.seq)
        ).scalars().all()
    assert [d["input"] for d in inputs] == [*sent[:4], {"q": [1, 2]}]
    assert_chains_ok(db)


def test_spans_of_a_trace_another_owner_exported_are_refused(db):
    """A trace's runs belong to the owner whose token exported it: another owner's spans of
    the same trace are refused (reported, not stored), whether they would join a recorded run,
    complete a waiting one, or repeat its very spans."""
    recorded, waiting = _trace(51), _trace(52)
    mine = _tree(recorded, "owned-agent", _chat())
    assert receive_spans(db, "alice", mine).runs_written == 1
    stray = _span(waiting, "b" * 16, "a" * 16, _chat(), 10, 20)  # its agent span not yet sent
    assert receive_spans(db, "alice", [stray]).new == 1
    before = (_claims(db, recorded), _claims(db, waiting), _count(db, AgentRun))

    for spans in ([_span(recorded, "c" * 16, "a" * 16, _chat(), 30, 40)],  # under alice's run
                  [_span(waiting, "a" * 16, None, _agent("bobs-agent"))],  # alice's span's parent
                  mine):  # alice's spans, again
        outcome = receive_spans(db, "bob", spans)
        assert (outcome.new, outcome.runs_written, outcome.rejected) == (0, 0, len(spans))
        assert "another owner" in outcome.error_message
    assert (_claims(db, recorded), _claims(db, waiting), _count(db, AgentRun)) == before
    with db.read() as s:
        assert set(s.execute(select(OtlpSpan.owner_id)).scalars()) == {"alice"}
    # alice completes her trace as before
    assert receive_spans(db, "alice", [_span(waiting, "a" * 16, None, _agent("owned-agent"))]
                         ).runs_written == 1


def _flushed_within(db, seconds: float) -> int:
    """``flush_quiet_traces`` in a thread that must end: a loop that never ends fails here, not
    at the suite's timeout."""
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(flush_quiet_traces(db, quiet_seconds=0)),
                              daemon=True)
    worker.start()
    worker.join(seconds)
    assert done, "flush_quiet_traces did not end"
    return done[0]


def test_spans_that_name_each_other_as_parents_are_each_placed_once(db):
    """Parent ids are the sender's. A span that is its own parent, or two that are each other's,
    never showed a chain to a root: after the quiet period the flush built their tree by
    following children, each span again under itself, forever (the reconciler's thread spun,
    its memory grew, and no lease expired meanwhile)."""
    alone, pair = _trace(41), _trace(42)
    spans = [_span(alone, "a" * 16, "a" * 16, _agent("self-parent")),
             _span(pair, "a" * 16, "b" * 16, _agent("pair-agent")),
             _span(pair, "b" * 16, "a" * 16, _chat(), 10, 20)]
    waiting = receive_spans(db, "alice", spans)
    assert (waiting.new, waiting.runs_written, waiting.rejected) == (3, 0, 0)
    assert _flushed_within(db, 30) == 2
    (lone_run,) = set(_claims(db, alone).values())
    (pair_run,) = set(_claims(db, pair).values())  # the chat span is the agent's content
    with db.read() as s:
        usage = s.execute(select(RunEvent.data).where(RunEvent.run_id == pair_run,
                                                      RunEvent.type == "usage")).scalar_one()
        assert usage["input_tokens"] == 10
        statuses = set(s.execute(select(AgentRun.status).where(
            AgentRun.id.in_([lone_run, pair_run]))).scalars())
    assert statuses == {"succeeded"}
    assert _flushed_within(db, 30) == 0
    assert_chains_ok(db)


def test_agent_spans_nested_deeper_than_a_run_tree_goes_are_refused(db):
    """A run tree is built, read and checked recursively in places: a sender nesting agent spans
    1,500 deep got a 500 (RecursionError) and lost the export. Beyond ``MAX_RUN_DEPTH`` the
    trace is kept and refused; at it, every level is a run."""
    def chain(trace: str, depth: int) -> list[ReceivedSpan]:
        ids = [f"{level + 1:016x}" for level in range(depth)]
        return [_span(trace, ids[level], ids[level - 1] if level else None,
                      _agent(f"level-{level % 3}"), level, 10_000 - level)
                for level in range(depth)]

    deep = _trace(51)
    outcome = receive_spans(db, "alice", chain(deep, 1_500))
    assert (outcome.new, outcome.runs_written, outcome.rejected) == (1_500, 0, 1_500)
    assert f"nest more than {MAX_RUN_DEPTH} levels deep" in outcome.error_message
    assert set(_claims(db, deep).values()) == {NOT_RECORDED}
    fits = receive_spans(db, "alice", chain(_trace(52), MAX_RUN_DEPTH))
    assert (fits.runs_written, fits.rejected) == (MAX_RUN_DEPTH, 0)
    assert_chains_ok(db)


def test_a_span_that_names_itself_as_its_parent_is_refused_on_receipt():
    trace, span_id = "ab" * 16, "cd" * 8
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": trace, "spanId": span_id, "parentSpanId": parent, "name": "invoke_agent x",
         "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000"}
        for parent in (span_id, "")]}]}]}
    export, _kind = decode_export(json.dumps(body).encode(), "application/json", None)
    spans, refused = spans_of(export)
    assert refused == 1 and [s.parent_span_id for s in spans] == [None]


def test_a_token_count_that_is_no_count_refuses_the_tree_rather_than_becoming_one(db):
    """-5 was recorded as 0, "abc" as 0 and 3.7 as 3: numbers nobody sent, in the audit record.
    Such a count refuses the tree like one beyond 10^12; a count written as a float or as
    digits is the count, and one the span does not carry is 0."""
    refused = {"minus": -5, "text": "abc", "fraction": 3.7, "flag": True}
    for n, (label, value) in enumerate(refused.items()):
        outcome = receive_spans(db, "alice", _tree(_trace(60 + n), f"count-{label}",
                                                   {**_chat(), "gen_ai.usage.input_tokens": value}))
        assert (outcome.runs_written, outcome.rejected) == (0, 2), label
        assert "gen_ai.usage.input_tokens is" in outcome.error_message
        assert "not a token count" in outcome.error_message
    kept = {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 12.0}  # no output
    outcome = receive_spans(db, "alice", _tree(_trace(70), "count-kept", kept))
    assert (outcome.runs_written, outcome.rejected) == (1, 0)
    (run_id,) = set(_claims(db, _trace(70)).values())
    digits = receive_spans(db, "alice", _tree(_trace(71), "count-kept", {
        **_chat(), "gen_ai.usage.output_tokens": "7"}))
    assert digits.runs_written == 1
    (digits_run,) = set(_claims(db, _trace(71)).values())
    with db.read() as s:
        usage = dict(s.execute(select(RunEvent.run_id, RunEvent.data).where(
            RunEvent.run_id.in_([run_id, digits_run]), RunEvent.type == "usage")).tuples().all())
    assert (usage[run_id]["input_tokens"], usage[run_id]["output_tokens"]) == (12, 0)
    assert (usage[digits_run]["input_tokens"], usage[digits_run]["output_tokens"]) == (10, 7)
    assert_chains_ok(db)
