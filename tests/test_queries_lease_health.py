"""queries.lease_health: live executors, runs held, time left on leases, runs at risk, and the
reconciler's lag, all against the database clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from support import history as h
from support.factories import claim

from agentledger.core.schema import AgentRun
from ingest.otlp import receive_spans
from ingest.otlp.wire import ReceivedSpan
from queries.lease_health import lease_health


def ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


@pytest.fixture
def ledger(db):
    h.agent(db, "bot")
    chats = [h.chat(db, owner="alice", agent_id="bot") for _ in range(7)]
    runs = {}
    # Live, claimed on the real clock (no replay): a healthy lease and one about to end.
    runs["healthy"] = h.ask(db, chats[0], "q", owner="alice", when=ago(5)).run_id
    h.start(db, runs["healthy"], ago(1), "exec-a", lease_seconds=301)
    runs["at_risk"] = h.ask(db, chats[1], "q", owner="alice", when=ago(5)).run_id
    h.start(db, runs["at_risk"], ago(1), "exec-a", lease_seconds=6)
    # Its executor's last heartbeat was 130 s ago: the lease ended 70 s ago, not reconciled yet.
    runs["expired"] = h.ask(db, chats[2], "q", owner="alice", when=ago(200)).run_id
    h.start(db, runs["expired"], ago(180), "exec-b", lease_seconds=60)
    h.beat(db, runs["expired"], ago(130), "exec-b", lease_seconds=60)
    # exec-c finished a run two minutes ago and holds nothing now.
    runs["recent"] = h.answered(db, chats[3], "q", "a", owner="alice", when=ago(150),
                                executor="exec-c").run_id
    # Decoys: an executor last seen two hours ago, and a queued run (no lease).
    runs["old"] = h.answered(db, chats[4], "q", "a", owner="alice", when=ago(7200),
                             executor="exec-old").run_id
    runs["queued"] = h.ask(db, chats[5], "q", owner="alice", when=ago(3)).run_id
    return runs


def health(db, **kwargs):
    with db.read() as s:
        return lease_health(s, **kwargs)


def test_leases_soonest_first_with_time_left(db, ledger):
    found = health(db)
    assert [x["run_id"] for x in found.leases] == [ledger[k] for k in ("expired", "at_risk",
                                                                       "healthy")]
    expired, at_risk, healthy = found.leases
    assert expired["expired"] and not expired["at_risk"]
    assert expired["seconds_left"] == pytest.approx(-70, abs=5)
    assert at_risk["at_risk"] and not at_risk["expired"]
    assert 0 < at_risk["seconds_left"] <= 5
    assert not healthy["at_risk"] and healthy["seconds_left"] == pytest.approx(300, abs=5)
    assert healthy["executor_instance_id"] == "exec-a" and healthy["status"] == "running"
    assert healthy["agent_name"] == "Bot" and healthy["lease_expires_at"] is not None
    assert not found.leases_truncated


def test_summary_counts_and_reconcile_lag(db, ledger):
    found = health(db)
    assert (found.live_leases, found.at_risk, found.expired_unreconciled, found.queued) == (2, 1, 1, 1)
    assert found.reconcile_lag_seconds == pytest.approx(70, abs=5)
    assert found.summary() == {
        "now": found.now.isoformat(), "executors": 3, "queued": 1, "live_leases": 2, "at_risk": 1,
        "expired_unreconciled": 1, "reconcile_lag_seconds": found.reconcile_lag_seconds,
    }


def test_executors_seen_lately(db, ledger):
    found = health(db)
    executors = {e["executor_instance_id"]: e for e in found.executors}
    assert set(executors) == {"exec-a", "exec-b", "exec-c"}
    assert executors["exec-a"]["runs_held"] == 2
    assert executors["exec-a"]["seconds_since_heartbeat"] == pytest.approx(1, abs=5)
    assert executors["exec-b"]["runs_held"] == 1
    assert executors["exec-b"]["seconds_since_heartbeat"] == pytest.approx(130, abs=5)
    assert executors["exec-c"]["runs_held"] == 0 and executors["exec-c"]["runs_ended_recently"] == 1
    assert executors["exec-c"]["last_seen_at"] > executors["exec-c"]["last_heartbeat_at"]


def test_a_service_whose_runs_were_recorded_from_traces_is_no_executor(db, ledger):
    # An app that exports its agent's spans: the run is recorded as succeeded a moment ago,
    # under ``otlp:<service.name>``, with no lease held and no heartbeat ever sent.
    span_at = ago(3)
    agent = ReceivedSpan(f"{7:032x}", "a" * 16, None, "checkout", "invoke_agent", span_at,
                         span_at + timedelta(seconds=1), 0, None,
                         {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner",
                          "input.value": "plan", "output.value": "planned"})
    assert receive_spans(db, "alice", [agent]).runs_written == 1
    with db.read() as s:
        recorded = s.execute(select(AgentRun.executor_instance_id, AgentRun.status)
                             .where(AgentRun.agent_id != "bot")).one()
    assert tuple(recorded) == ("otlp:checkout", "succeeded")
    found = health(db)
    assert {e["executor_instance_id"] for e in found.executors} == {"exec-a", "exec-b", "exec-c"}
    assert found.summary()["executors"] == 3


def test_thresholds_are_parameters(db, ledger):
    wide = health(db, seen_within_minutes=24 * 60, at_risk_seconds=400)
    assert wide.at_risk == 2
    assert "exec-old" in {e["executor_instance_id"] for e in wide.executors}
    narrow = health(db, seen_within_minutes=1)
    assert {e["executor_instance_id"] for e in narrow.executors} == {"exec-a", "exec-b"}


def test_leases_are_bounded(db, ledger):
    found = health(db, limit=1)
    assert [x["run_id"] for x in found.leases] == [ledger["expired"]] and found.leases_truncated
    assert found.live_leases == 2  # the counts still cover every lease


def test_nothing_running(db):
    found = health(db)
    assert found.leases == [] and found.executors == []
    assert (found.live_leases, found.at_risk, found.expired_unreconciled) == (0, 0, 0)
    assert found.reconcile_lag_seconds == 0.0


def test_a_reconciled_lease_is_no_longer_lag(db, ledger):
    h.expire(db, ledger["expired"], datetime.now(UTC))
    found = health(db)
    assert found.expired_unreconciled == 0 and found.reconcile_lag_seconds == 0.0
    assert [x["run_id"] for x in found.leases] == [ledger["at_risk"], ledger["healthy"]]


def test_uses_the_same_clock_as_the_writers(db):
    # A lease claimed now for 30 s has about 30 s left by the query's clock, on either database.
    h.agent(db, "bot")
    h.ask(db, h.chat(db, owner="alice", agent_id="bot"), "q", owner="alice", when=ago(1))
    [claimed] = claim(db, "exec-z", lease_seconds=30)
    [lease] = health(db).leases
    assert lease["run_id"] == claimed.run_id
    assert lease["seconds_left"] == pytest.approx(30, abs=3)
