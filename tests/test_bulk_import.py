"""ingest.bulk_import: complete histories at COPY speed (PostgreSQL) or executemany (SQLite),
exactly as the live path would have stored them: verify accepts them, seqs and hashes are right,
the outcome rollup moves with them, and an invalid history writes nothing."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import combinations, pairwise
from pathlib import Path

import pytest
from sqlalchemy import func, select
from support.factories import claim, make_agent, make_session
from support.ledger import (
    assert_run_invariants,
    counts,
    events,
    fresh_database,
    message_row,
    run_row,
)
from support.rollup import assert_rollup_matches_scan

from agentledger import demo
from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.errors import (
    CancelRequested,
    IllegalTransition,
    LedgerError,
    RunTerminal,
    UnknownAgent,
    ValidationFailed,
)
from agentledger.core.hashing import GENESIS_HASH, event_hash, sha256_hex, snapshot_sha256
from agentledger.core.migrate import upgrade
from agentledger.core.schema import AgentRun, ChatSession, Message, RunEvent
from agentledger.demo_history import SHOWCASE, synthetic_history, synthetic_shares
from ingest.bulk_import import (
    ImportedEvent,
    ImportedRun,
    ImportedSession,
    bulk_import,
    bulk_import_shares,
    collector_paused,
    iter_runs,
)
from ingest.runs import ContextItem
from queries.chain_verification import verify_chains
from queries.metrics import interrupted_by_reason

T = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
INTERRUPT_REASONS = {"lease_expired", "parent_terminal", "service_restart", "executor_shutdown"}

# Every bulk import of this module starts after this: the minute rollup's cut of each import
# lies between the minutes kept then and when it is checked (support.rollup).
IMPORTS_FROM = datetime.now(UTC)


def s(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def ev(type_: str, data: dict, at: float) -> ImportedEvent:
    return ImportedEvent(type_, data, s(at))


def started(at: float, executor: str = "ext-1") -> ImportedEvent:
    return ev("run.started", {"executor_instance_id": executor,
                              "lease_expires_at": s(at + 60).isoformat()}, at)


def answered_run(chat, *, content="hi", answer=("Hel", "lo"), at=0.0, children=(), extra=()):
    evs = [started(at + 1), *extra]
    evs += [ev("message.delta", {"text": part}, at + 4 + n / 10) for n, part in enumerate(answer)]
    evs += [ev("usage", {"input_tokens": 10, "output_tokens": 3, "cost_usd": 0.002}, at + 4.5),
            ev("run.completed", {}, at + 5)]
    return ImportedRun(agent_id="alpha", agent_version=1, input=content, created_at=s(at),
                       events=evs, session=chat, children=list(children))


@pytest.fixture
def agents(db):
    make_agent(db, "alpha", versions=2)
    make_agent(db, "beta")
    return db


def test_a_hand_built_history_is_stored_like_the_live_path(agents):
    db = agents
    chat = ImportedSession(owner_id="alice", agent_id="alpha", created_at=s(-10), title="imported")
    child = ImportedRun(agent_id="beta", agent_version=1, input="sub", created_at=s(2.5), events=[
        started(3, "ext-2"),
        ev("run.failed", {"error": {"code": "tool_error", "message": "timeout"}}, 4),
    ])
    parent = answered_run(chat, children=[child], extra=[
        ev("run.child_created", {"child_run_id": child.id, "agent_id": "beta"}, 2.5),
        ev("run.child_finished", {"child_run_id": child.id, "status": "failed"}, 4),
    ])
    parent.context = [ContextItem("kb-1", "KB", "knowledge", 2)]
    parent.idempotency_key = "import-1"
    report = bulk_import(db, [parent])
    assert (report.runs, report.events, report.messages, report.sessions) == (2, 11, 2, 1)

    with db.read(transaction=True) as session:
        assert verify_chains(session).ok
    p, c = run_row(db, parent.id), run_row(db, child.id)
    assert (p.status, p.root_run_id, p.parent_run_id, p.session_id) == ("succeeded", parent.id, None, chat.id)
    assert (c.status, c.root_run_id, c.parent_run_id, c.session_id) == ("failed", parent.id, parent.id, None)
    assert c.thread_id != p.thread_id and p.thread_id == chat.thread_id
    assert p.agent_execution_snapshot["name"] == "Alpha" and p.agent_execution_snapshot["version"] == 1
    assert c.context_pack_snapshot == p.context_pack_snapshot
    assert p.context_pack_snapshot["items"][0]["id"] == "kb-1"
    assert (p.created_at, p.started_at, p.finished_at) == (s(0), s(1), s(5))
    assert (p.executor_instance_id, p.lease_expires_at, c.executor_instance_id) == ("ext-1", s(61), "ext-2")
    assert c.error == {"code": "tool_error", "message": "timeout"} and p.error is None
    assert p.idempotency_key_hash is not None and c.final_message_id is None
    answer = message_row(db, p.final_message_id)
    assert (answer.role, answer.content, answer.run_id, answer.created_at) == ("assistant", "Hello", parent.id, s(5))
    question = message_row(db, p.user_message_id)
    assert (question.role, question.content, question.session_id) == ("user", "hi", chat.id)

    evs = assert_run_invariants(db, parent.id)
    assert [e.type for e in evs] == ["run.queued", "run.started", "run.child_created",
                                     "run.child_finished", "message.delta", "message.delta",
                                     "usage", "run.completed"]
    # the question and both frozen snapshots, bound into the chain by their digests
    assert evs[0].data == {"agent_id": "alpha", "session_id": chat.id, "parent_run_id": None,
                           "input_sha256": sha256_hex("hi"),
                           "agent_snapshot_sha256": snapshot_sha256(p.agent_execution_snapshot),
                           "context_pack_sha256": snapshot_sha256(p.context_pack_snapshot)}
    child_queued = assert_run_invariants(db, child.id)[0].data
    assert child_queued["context_pack_sha256"] == snapshot_sha256(c.context_pack_snapshot)
    assert child_queued["agent_snapshot_sha256"] == snapshot_sha256(c.agent_execution_snapshot)
    # the answer's text is bound into the chain by its digest
    assert evs[-1].data == {"final_message_id": p.final_message_id,
                            "content_sha256": hashlib.sha256(b"Hello").hexdigest()}
    assert assert_run_invariants(db, child.id)[0].data["parent_run_id"] == parent.id
    # the stored hashes are the chain of the live path's event_hash
    with db.read() as session:
        stored = session.execute(select(RunEvent.seq, RunEvent.type, RunEvent.data,
                                        RunEvent.created_at, RunEvent.hash)
                                 .where(RunEvent.run_id == parent.id).order_by(RunEvent.seq)).all()
    chain = GENESIS_HASH
    for row in stored:
        chain = event_hash(chain, parent.id, row.seq, row.type, row.data, row.created_at)
        assert row.hash == chain
    assert (p.last_event_seq, p.last_event_hash) == (8, chain)
    assert_rollup_matches_scan(db, imported_since=IMPORTS_FROM)
    # imported runs are terminal: a live worker finds nothing to claim
    assert claim(db) == []


def test_an_imported_answers_evidence_bundle_verifies_with_nothing_uncovered(agents):
    """Everything a bundle binds (run rows, snapshots, the answer and its time) is written by
    the importer as the live path writes it."""
    from agentledger.core.evidence_format import verify_bundle
    from queries.evidence import evidence_bundle

    db = agents
    chat = ImportedSession(owner_id="alice", agent_id="alpha", created_at=s(-10), title="imported")
    child = ImportedRun(agent_id="beta", agent_version=1, input="sub", created_at=s(2.5), events=[
        started(3, "ext-2"), ev("message.delta", {"text": "part"}, 3.5),
        ev("run.completed", {}, 4)])
    parent = answered_run(chat, children=[child], extra=[
        ev("run.child_created", {"child_run_id": child.id, "agent_id": "beta"}, 2.5),
        ev("run.child_finished", {"child_run_id": child.id, "status": "succeeded"}, 4)])
    parent.context = [ContextItem("kb-1", "KB", "knowledge", 2)]
    bulk_import(db, [parent])
    for run_id in (parent.id, child.id):  # the root's answer, and the child's
        with db.read() as session:
            doc = evidence_bundle(session, run_row(db, run_id).final_message_id)
        report = verify_bundle(json.loads(json.dumps(doc)))
        assert report.ok and report.notes == (), (report.problems, report.notes)


def test_the_importer_leaves_the_histories_it_is_given_as_they_were(agents):
    chat = ImportedSession(owner_id="alice", agent_id="alpha", created_at=s(-10), title="kept")
    run = answered_run(chat)
    run.events[-1] = ev("run.completed", {"content": "Hello there"}, 5)
    given = [dict(e.data) for e in run.events]
    bulk_import(agents, [run])
    assert [e.data for e in run.events] == given  # the stored copies were changed, not these
    assert message_row(agents, run_row(agents, run.id).final_message_id).content == "Hello there"


def test_import_into_an_existing_session_and_runs_without_a_session(agents):
    db = agents
    existing = make_session(db, owner="bob", agent_id="alpha")
    first = answered_run(existing, at=0)
    lone = ImportedRun(agent_id="beta", agent_version=1, input="cron job", created_at=s(1),
                       owner_id="svc", events=[ev("run.cancelled", {"external_stop_confirmed": True}, 2)])
    bulk_import(db, [first, lone])
    assert run_row(db, first.id).owner_id == "bob"
    assert run_row(db, first.id).thread_id == h_thread(db, existing)
    row = run_row(db, lone.id)
    assert (row.status, row.session_id, row.owner_id, row.started_at) == ("cancelled", None, "svc", None)
    assert [e.type for e in events(db, lone.id)] == ["run.queued", "run.cancelled"]
    assert_rollup_matches_scan(db, imported_since=IMPORTS_FROM)


def h_thread(db, session_id):
    with db.read() as session:
        return session.execute(select(ChatSession.thread_id).where(ChatSession.id == session_id)).scalar_one()


def _bad_histories(chat):
    def run(*evs, agent="alpha", version=1, **kw):
        return ImportedRun(agent_id=agent, agent_version=version, input="x", created_at=s(0),
                           events=list(evs), session=chat, **kw)

    done = ev("run.completed", {}, 9)
    orphan = ImportedRun(agent_id="beta", agent_version=1, input="x", created_at=s(2), events=[
        ev("run.interrupted", {"reason": "parent_terminal"}, 3)])
    announce = ev("run.child_created", {"child_run_id": orphan.id, "agent_id": "beta"}, 2)
    return {
        "no terminal event": (run(started(1)), IllegalTransition),
        "event after the terminal one": (run(started(1), done, ev("usage", {
            "input_tokens": 1, "output_tokens": 1, "cost_usd": 0}, 10)), RunTerminal),
        "two terminal events": (run(started(1), done, done), RunTerminal),
        "progress before start": (run(ev("message.delta", {"text": "x"}, 1), done), IllegalTransition),
        "completed while cancelling": (run(started(1), ev("run.cancelling", {"requested_by": "u"}, 2),
                                           done), CancelRequested),
        "bad event data": (run(started(1), ev("usage", {"input_tokens": -1, "output_tokens": 0,
                                                       "cost_usd": 0}, 2), done), ValidationFailed),
        "unknown event type": (run(started(1), ev("run.paused", {}, 2), done), ValidationFailed),
        "run.queued given": (run(ev("run.queued", {}, 0), started(1), done), IllegalTransition),
        "time goes backwards": (run(started(5), ev("run.completed", {}, 4)), ValidationFailed),
        "naive time": (run(ImportedEvent("run.cancelled", {"external_stop_confirmed": True},
                                         datetime(2026, 1, 1))), ValidationFailed),
        "unknown agent version": (run(started(1), done, version=9), UnknownAgent),
        "unknown agent": (run(started(1), done, agent="nobody"), UnknownAgent),
        "child not announced": (run(started(1), done, children=[orphan]), ValidationFailed),
        # The parent's run.child_finished must say how its child's history ends (interrupted).
        "child told to end otherwise": (run(started(1), announce, ev("run.child_finished", {
            "child_run_id": orphan.id, "status": "succeeded"}, 4), done, children=[orphan]),
            ValidationFailed),
        "a stranger told finished": (run(started(1), announce, ev("run.child_finished", {
            "child_run_id": "run_stranger", "status": "interrupted"}, 4), done,
            children=[orphan]), ValidationFailed),
        "NUL in text": (run(started(1), ev("message.delta", {"text": "a\x00"}, 2), done), ValidationFailed),
    }


def test_an_invalid_history_is_refused_and_writes_nothing(agents):
    db = agents
    good = answered_run(ImportedSession(owner_id="alice", agent_id="alpha", created_at=s(-1)))
    bulk_import(db, [good])
    before = counts(db)
    with db.read() as session:
        sessions_before = session.execute(select(func.count()).select_from(ChatSession)).scalar_one()
    for name, (bad, error) in _bad_histories(
            ImportedSession(owner_id="alice", agent_id="alpha", created_at=s(-1))).items():
        # the valid run in the same batch is not written either
        valid = answered_run(ImportedSession(owner_id="carol", agent_id="alpha", created_at=s(-1)))
        with pytest.raises(error) as raised:
            bulk_import(db, [valid, bad])
        assert isinstance(raised.value, LedgerError), name
        assert counts(db) == before, name
    with db.read(transaction=True) as session:
        assert session.execute(select(func.count()).select_from(ChatSession)).scalar_one() == sessions_before
        assert verify_chains(session).ok
    assert_rollup_matches_scan(db, imported_since=IMPORTS_FROM)


def test_synthetic_history_in_batches_verifies_and_rolls_up(agents, capsys):
    db = agents
    timeline = demo._all_versions_registered(db, T - timedelta(days=3), 3)
    trees = list(synthetic_history(runs=120, start=T - timedelta(days=3), days=3,
                                   versions=timeline, seed=4))
    runs = list(iter_runs(trees))
    seen = []
    started_at = time.perf_counter()
    report = bulk_import(db, trees, batch_runs=50, progress=seen.append)
    elapsed = time.perf_counter() - started_at
    with capsys.disabled():
        print(f"\n[{db.dialect}] bulk import: {report.runs} runs, {report.events} events in "
              f"{elapsed:.2f} s = {report.events / elapsed:,.0f} events/s "
              f"({report.runs / elapsed:,.0f} runs/s, {report.batches} batches)")
    assert sum(seen) == 120 and report.batches >= 4
    assert report.runs == len(runs) > 120
    with db.read(transaction=True) as session:
        assert verify_chains(session).ok
        stored_runs = session.execute(select(AgentRun.id, AgentRun.status, AgentRun.last_event_seq,
                                             AgentRun.final_message_id)).all()
        n_events = session.execute(select(func.count()).select_from(RunEvent)).scalar_one()
        roles = Counter(session.execute(select(Message.role)).scalars())
        reasons = {d["reason"] for d in session.execute(
            select(RunEvent.data).where(RunEvent.type == "run.interrupted")).scalars()}
    assert len(stored_runs) == report.runs and n_events == report.events
    assert sum(r.last_event_seq for r in stored_runs) == n_events
    statuses = Counter(r.status for r in stored_runs)
    assert set(statuses) == {"succeeded", "failed", "cancelled", "interrupted"}
    assert reasons == INTERRUPT_REASONS
    with db.read() as session:  # what agentledger_runs_interrupted_total reports
        counted = interrupted_by_reason(session)
        by_reason = Counter(session.execute(
            select(AgentRun.end_reason).where(AgentRun.status == "interrupted")).scalars())
    assert counted == {r: by_reason.get(r, 0) for r in INTERRUPT_REASONS}
    assert sum(counted.values()) == statuses["interrupted"]
    assert roles == {"user": 120, "assistant": statuses["succeeded"]}
    assert 8 <= n_events / report.runs <= 12
    for run in runs[:40]:
        assert_run_invariants(db, run.id)
    assert_rollup_matches_scan(db, imported_since=IMPORTS_FROM)


def _tree_shape(trees: list[ImportedRun]) -> list:
    """A history without its generated ids."""
    return [(t.agent_id, t.agent_version, t.created_at, getattr(t.session, "owner_id", None),
             [(e.type, e.at) for e in t.events], _tree_shape(t.children)) for t in trees]


def test_a_synthetic_history_in_shares_is_its_seed_s_and_each_share_keeps_its_sessions(agents):
    db = agents
    start = T - timedelta(days=3)
    timeline = demo._all_versions_registered(db, start, 3)

    def shares():
        return list(synthetic_shares(runs=100, start=start, days=3, versions=timeline, seed=5,
                                     roots_per_share=30))

    first, again = shares(), shares()
    assert [(share.first, share.last) for share in first] == [(0, 30), (30, 60), (60, 90),
                                                              (90, 100)]
    built = [share() for share in first]
    assert [_tree_shape(trees) for trees in built] == [_tree_shape(share()) for share in again]
    session_ids = [{t.session.id for t in trees} for trees in built]
    assert all(a.isdisjoint(b) for a, b in combinations(session_ids, 2))
    roots = [t for trees in built for t in trees]
    assert all(a.created_at < b.created_at for a, b in pairwise(roots))
    assert sorted(case for share in first for case in share.forced.values()) == sorted(SHOWCASE)

    seen: list[int] = []
    report = bulk_import_shares(db, first, progress=seen.append)
    assert seen == [30, 30, 30, 10] and report.batches == 4
    with db.read(transaction=True) as session:
        assert verify_chains(session).ok
        statuses = Counter(session.execute(select(AgentRun.status)).scalars())
        reasons = {d["reason"] for d in session.execute(
            select(RunEvent.data).where(RunEvent.type == "run.interrupted")).scalars()}
    assert sum(statuses.values()) == report.runs > 100
    assert set(statuses) == {"succeeded", "failed", "cancelled", "interrupted"}
    assert reasons == INTERRUPT_REASONS
    assert_rollup_matches_scan(db, imported_since=IMPORTS_FROM)


def test_batches_are_built_with_the_cyclic_collector_paused_and_it_runs_again_after(agents):
    db = agents
    collecting: list[bool] = []

    def share() -> list[ImportedRun]:
        collecting.append(gc.isenabled())
        chat = ImportedSession(owner_id="u1", agent_id="alpha", created_at=T)
        return [answered_run(chat)]

    def refused() -> list[ImportedRun]:
        raise ValidationFailed("not this one")

    assert gc.isenabled()
    report = bulk_import_shares(db, [share, share])
    assert collecting == [False, False] and report.runs == 2
    assert gc.isenabled()
    with pytest.raises(ValidationFailed):
        bulk_import_shares(db, [refused])
    assert gc.isenabled()
    gc.disable()  # a caller that turned it off itself keeps it off
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@dataclass(frozen=True)
class _BuiltShare:
    """A share whose trees were built beforehand (their ids fixed), to compare two paths."""

    trees: tuple[ImportedRun, ...]

    def __call__(self) -> list[ImportedRun]:
        return list(self.trees)


def test_demo_seed_takes_the_bulk_path_for_large_n(db, monkeypatch):
    from test_demo import describe

    monkeypatch.setattr(demo, "BULK_THRESHOLD", 20)
    assert demo.seed(Settings(database_url=db.url), runs=40, days=5, seed=2) == 40
    data = describe(db)
    assert data["roots"] == 40 and data["max_depth"] >= 2
    assert sum(n >= 2 for n in data["versions"].values()) >= 3
    assert len({(r.agent_id, r.agent_version) for r in data["runs"]}) > len(data["versions"])
    assert set(data["statuses"]) == {"succeeded", "failed", "cancelled", "interrupted"}
    assert set(data["interrupted"]) == INTERRUPT_REASONS
    assert data["switching_sessions"] >= 1 and len(data["owners"]) >= 3
    assert data["answers"] == data["statuses"]["succeeded"]
    assert data["event_types"]["run.child_created"] == data["event_types"]["run.queued"] - 40
    assert all(u["cost_usd"] > 0 for u in data["usage"])
    with db.read(transaction=True) as session:
        assert verify_chains(session).ok
    assert_rollup_matches_scan(db, imported_since=IMPORTS_FROM)
    # and again: the agents are kept, the history grows
    assert demo.seed(Settings(database_url=db.url), runs=30, days=5, seed=3) == 30
    assert describe(db)["roots"] == 70
    assert_rollup_matches_scan(db, imported_since=IMPORTS_FROM)


def _stored_shape(db) -> dict:
    """What an import stored, without the ids it generated (message and thread ids, and the
    hashes and final_message_id that name them)."""
    with db.read() as session:
        runs = sorted(session.execute(select(
            AgentRun.id, AgentRun.status, AgentRun.last_event_seq, AgentRun.session_id,
            AgentRun.parent_run_id, AgentRun.agent_version, AgentRun.created_at,
            AgentRun.finished_at)).all())
        event_types = sorted(session.execute(select(RunEvent.run_id, RunEvent.seq, RunEvent.type,
                                                    RunEvent.created_at)).all())
        sessions = sorted(session.execute(select(ChatSession.id, ChatSession.owner_id,
                                                 ChatSession.agent_id)).all())
        roles = Counter(session.execute(select(Message.role)).scalars())
    return {"runs": runs, "events": event_types, "sessions": sessions, "roles": roles}


@contextmanager
def _beside_one_process(db, tmp_path, start):
    """A second, fresh database with the demo agents, for the one-process path; afterwards the
    chains of ``db`` verify and its rollup matches a scan."""
    with fresh_database(db.dialect, tmp_path) as other_url:
        upgrade(other_url)
        one_process = Database(other_url)
        try:
            timeline = demo._all_versions_registered(db, start, 2)
            demo._all_versions_registered(one_process, start, 2)
            yield one_process, timeline
        finally:
            one_process.dispose()
    with db.read(transaction=True) as session:
        assert verify_chains(session).ok
    assert_rollup_matches_scan(db, imported_since=IMPORTS_FROM)


@pytest.mark.slow  # starts worker processes (spawned: about a second each)
def test_batches_prepared_in_worker_processes_store_what_one_process_does(db, tmp_path):
    """Sessions that span batches are written once, by their first batch; chains verify, the
    rollup matches a scan, and the stored rows are those of the in-process path."""
    start = T - timedelta(days=2)
    with _beside_one_process(db, tmp_path, start) as (one_process, timeline):
        trees = list(synthetic_history(runs=300, start=start, days=2, versions=timeline, seed=8))
        sessions = Counter(t.session.id for t in trees)
        assert max(sessions.values()) > 1  # sessions are shared by several runs
        report = bulk_import(db, trees, batch_runs=60, workers=2)
        bulk_import(one_process, trees, batch_runs=60)
        assert report.batches >= 5
        assert _stored_shape(db) == _stored_shape(one_process)


@pytest.mark.slow  # starts worker processes
def test_shares_built_in_worker_processes_store_what_bulk_import_does(db, tmp_path):
    start = T - timedelta(days=2)
    with _beside_one_process(db, tmp_path, start) as (one_process, timeline):
        shares = [_BuiltShare(tuple(share())) for share in synthetic_shares(
            runs=200, start=start, days=2, versions=timeline, seed=9, roots_per_share=40)]
        seen: list[int] = []
        report = bulk_import_shares(db, shares, workers=2, progress=seen.append)
        bulk_import(one_process, [t for share in shares for t in share.trees], batch_runs=60)
        assert report.batches == 5 and seen == [40] * 5
        assert _stored_shape(db) == _stored_shape(one_process)


@pytest.mark.slow
def test_a_history_refused_in_a_worker_stops_the_import_with_its_error(agents):
    db = agents
    good = [answered_run(ImportedSession(owner_id="alice", agent_id="alpha", created_at=s(-1)),
                         at=n) for n in range(4)]
    bad = ImportedRun(agent_id="alpha", agent_version=9, input="x", created_at=s(30),
                      events=[started(31), ev("run.completed", {}, 32)],
                      session=ImportedSession(owner_id="bob", agent_id="alpha", created_at=s(29)))
    later = [answered_run(ImportedSession(owner_id="carol", agent_id="alpha", created_at=s(40)),
                          at=41 + n) for n in range(4)]
    with pytest.raises(UnknownAgent, match="version 9"):
        bulk_import(db, [*good, bad, *later], batch_runs=2, workers=1)
    with db.read() as session:
        stored = set(session.execute(select(AgentRun.id)).scalars())
    assert stored == {run.id for run in good}  # the batches before it, none after


def _children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_worker_processes_end_when_the_import_is_killed(pg_db, tmp_path):
    """SIGTERM to ``demo seed`` (no cleanup runs) must not leave workers behind blocked on a
    batch nobody reads (one database suffices: the workers' watch does not depend on it)."""
    db = pg_db
    seed = subprocess.Popen(
        [sys.executable, "-m", "agentledger.cli", "demo", "seed", "--runs", "200000", "--days", "30"],
        env={**os.environ, "AGENTLEDGER_DATABASE_URL": db.url}, cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while time.monotonic() < deadline and not workers:
            workers = {p for p in _children_of(seed.pid)
                       if "spawn_main" in (Path("/proc") / str(p) / "cmdline").read_text()}
            time.sleep(0.2)
        assert workers, "demo seed started no worker process"
        time.sleep(2)  # let them prepare batches
        seed.send_signal(signal.SIGTERM)
        seed.wait(timeout=30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.2)
        assert not any(_alive(p) for p in workers)
    finally:
        if seed.poll() is None:
            seed.kill()
