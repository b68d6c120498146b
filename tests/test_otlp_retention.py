"""Retention of the OTLP span buffer: ``agentledger archive`` prunes the buffered spans of traces
that were written (once their runs are archived) or abandoned, older than the horizon; spans of
traces whose runs are still live stay, so their re-export still writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, update

from agentledger.core.schema import AgentRun, ArchivedRun, OtlpSpan
from ingest.otlp import flush_quiet_traces, receive_spans
from ingest.otlp.wire import ReceivedSpan

OLD = datetime.now(UTC) - timedelta(days=40)
RECENT = datetime.now(UTC) - timedelta(days=1)


def _span(trace: str, span_id: str, parent: str | None, at: datetime, attrs: dict) -> ReceivedSpan:
    return ReceivedSpan(trace_id=trace, span_id=span_id, parent_span_id=parent,
                        service_name="svc", name=attrs.get("gen_ai.operation.name", "GET /"),
                        start_at=at, end_at=at + timedelta(seconds=1), status_code=0,
                        status_message=None, attributes=attrs)


def _agent_trace(trace: str, at: datetime) -> list[ReceivedSpan]:
    root = trace[:16]
    return [_span(trace, root, None, at, {"gen_ai.operation.name": "invoke_agent",
                                          "gen_ai.agent.name": "retained", "input.value": "hi",
                                          "output.value": "hello"}),
            _span(trace, "c" * 16, root, at, {"gen_ai.operation.name": "chat",
                                              "gen_ai.usage.input_tokens": 3,
                                              "gen_ai.usage.output_tokens": 2})]


def _received(db, trace: str, at: datetime) -> None:
    """Backdate a trace's arrival (the receiver stamps spans with the database clock)."""
    with db.write() as s:
        s.execute(update(OtlpSpan).where(OtlpSpan.trace_id == trace).values(received_at=at))


def _spans(db, trace: str) -> int:
    with db.read() as s:
        return s.execute(select(func.count()).select_from(OtlpSpan)
                         .where(OtlpSpan.trace_id == trace)).scalar_one()


def _archive(db_url: str, out) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env["AGENTLEDGER_DATABASE_URL"] = db_url
    return subprocess.run([sys.executable, "-m", "agentledger.cli", "archive",
                           "--older-than-days", "30", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.process
def test_archive_prunes_spans_of_written_and_abandoned_traces_only(db, db_url, tmp_path):
    written_old, live_old, written_recent, abandoned_old = (os.urandom(16).hex() for _ in range(4))
    # A trace whose run ended 40 days ago (archived below), one received 40 days ago whose run
    # ended yesterday (its run stays live), a recent one, and a plain HTTP trace (no agent,
    # model or tool span: never a run) that the quiet flush settles as not recorded.
    for trace, at in ((written_old, OLD), (live_old, RECENT), (written_recent, RECENT)):
        assert receive_spans(db, "owner", _agent_trace(trace, at)).runs_written == 1
    assert receive_spans(db, "owner", [_span(abandoned_old, "a" * 16, None, OLD, {})]).new == 1
    flush_quiet_traces(db, quiet_seconds=0)
    for trace in (written_old, live_old, abandoned_old):
        _received(db, trace, OLD)
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(OtlpSpan)
                         .where(OtlpSpan.run_id.is_(None))).scalar_one() == 0

    done = _archive(db_url, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "archived 1 run tree(s), 1 run(s)" in done.stdout
    assert "pruned 3 buffered OTLP span(s) of 2 trace(s)" in done.stdout
    assert (_spans(db, written_old), _spans(db, abandoned_old)) == (0, 0)
    assert (_spans(db, live_old), _spans(db, written_recent)) == (2, 2)

    # The spans kept still make a re-export of a live run's trace write nothing.
    with db.read() as s:
        runs = s.execute(select(func.count()).select_from(AgentRun)).scalar_one()
        assert s.execute(select(func.count()).select_from(ArchivedRun)).scalar_one() == 1
    again = receive_spans(db, "owner", _agent_trace(live_old, RECENT))
    assert (again.new, again.runs_written) == (0, 0)
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(AgentRun)).scalar_one() == runs

    # A second pass finds nothing more to prune.
    assert "pruned" not in _archive(db_url, tmp_path).stdout
