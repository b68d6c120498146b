"""OTLP spans whose runs the ledger cannot record (``ingest.otlp.record``): a count beyond what a
usage event holds, a model name longer than an agent version holds. Such a run tree is refused
on its own: its spans are kept, marked not recorded and reported back as rejected, while the
other traces of the export are recorded; nothing of the refused tree is written (no agent, no
session), and the quiet-trace flush never looks at it again. Attribute text that holds JSON the
ledger cannot store is kept as the text that was sent.

On SQLite and PostgreSQL."""

from __future__ import annotations

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
from ingest.otlp.record import NOT_RECORDED
from ingest.otlp.wire import ReceivedSpan

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
