"""``agentledger demo seed``: realistic history written through the real ingest path, on both
databases, that ``agentledger verify`` accepts, and that can be seeded more than once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from support.processes import TERMINAL

from agentledger.core.config import Settings
from agentledger.core.schema import Agent, AgentRun, AgentVersion, ChatSession, Message, RunEvent
from agentledger.demo import seed
from queries.chain_verification import verify_chains

INTERRUPT_REASONS = {"lease_expired", "parent_terminal", "service_restart", "executor_shutdown"}


def cli(db_url: str, *args: str, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env.update(AGENTLEDGER_DATABASE_URL=db_url, AGENTLEDGER_SECRET_KEY="demo-test",
               PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "agentledger.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def describe(db) -> dict:
    """What a dashboard user would look for in demo data, read straight from the tables."""
    with db.read() as s:
        run_rows = s.execute(select(
            AgentRun.id, AgentRun.status, AgentRun.parent_run_id, AgentRun.root_run_id,
            AgentRun.session_id, AgentRun.agent_id, AgentRun.agent_version, AgentRun.owner_id,
            AgentRun.created_at, AgentRun.finished_at, AgentRun.final_message_id,
        )).all()
        versions = dict(s.execute(
            select(AgentVersion.agent_id, func.count()).group_by(AgentVersion.agent_id)).all())
        interrupted = [d["reason"] for d in s.execute(
            select(RunEvent.data).where(RunEvent.type == "run.interrupted")).scalars()]
        usage = list(s.execute(select(RunEvent.data).where(RunEvent.type == "usage")).scalars())
        event_types = Counter(s.execute(select(RunEvent.type)).scalars())
        sessions = s.execute(select(func.count()).select_from(ChatSession)).scalar_one()
        answers = s.execute(select(func.count()).select_from(Message).where(
            Message.role == "assistant")).scalar_one()
        agents = s.execute(select(func.count()).select_from(Agent)).scalar_one()
    by_id = {r.id: r for r in run_rows}

    def depth(row) -> int:
        return 0 if row.parent_run_id is None else 1 + depth(by_id[row.parent_run_id])

    agents_per_session: dict[str, set] = defaultdict(set)
    for r in run_rows:
        if r.session_id:
            agents_per_session[r.session_id].add(r.agent_id)
    return {
        "runs": run_rows, "versions": versions, "agents": agents, "interrupted": interrupted,
        "usage": usage, "event_types": event_types, "sessions": sessions, "answers": answers,
        "statuses": Counter(r.status for r in run_rows),
        "max_depth": max((depth(r) for r in run_rows), default=0),
        "switching_sessions": sum(len(a) >= 2 for a in agents_per_session.values()),
        "owners": {r.owner_id for r in run_rows},
        "roots": sum(r.parent_run_id is None for r in run_rows),
    }


@pytest.mark.slow  # two whole demo seeds and their verification: seconds on each database
def test_demo_seed_writes_realistic_verifiable_history_and_can_run_twice(db, tmp_path):
    done = cli(db.url, "demo", "seed", "--runs", "60", "--seed", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "seeded 60 root runs" in done.stdout
    data = describe(db)

    assert data["roots"] == 60
    assert len(data["runs"]) > 60  # plus delegated children
    assert data["agents"] >= 4
    assert sum(n >= 2 for n in data["versions"].values()) >= 3  # several agents, several versions
    assert data["switching_sessions"] >= 1
    assert data["max_depth"] >= 2  # root -> child -> grandchild
    assert set(data["statuses"]) == set(TERMINAL)  # every terminal status, nothing left running
    assert set(data["interrupted"]) == INTERRUPT_REASONS
    assert data["usage"] and all(u["cost_usd"] > 0 and u["input_tokens"] > 0 for u in data["usage"])
    assert data["event_types"]["run.child_created"] == data["event_types"]["run.queued"] - 60
    assert data["event_types"]["tool.call"] == data["event_types"]["tool.result"] > 0
    assert len(data["owners"]) >= 3
    assert data["answers"] == data["statuses"]["succeeded"]
    # several versions actually ran, and history lies in the past two weeks
    assert len({(r.agent_id, r.agent_version) for r in data["runs"]}) > len(data["versions"])
    now = datetime.now(UTC)
    for r in data["runs"]:
        created = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=UTC)
        assert now - timedelta(days=14, minutes=1) <= created <= now
        assert r.finished_at >= r.created_at

    verified = cli(db.url, "verify", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith("OK")

    # seeding again adds history; agents already registered are kept as they are
    again = cli(db.url, "demo", "seed", "--runs", "20", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    second = describe(db)
    assert second["roots"] == 80
    assert second["versions"] == data["versions"]
    assert set(second["statuses"]) <= set(TERMINAL)
    assert cli(db.url, "verify", cwd=tmp_path).returncode == 0


def test_seed_is_repeatable_for_a_seed(tmp_path, sqlite_template):
    import shutil

    shapes = []
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    for name in ("a", "b"):
        path = tmp_path / f"{name}.db"
        shutil.copy(sqlite_template, path)
        settings = Settings(database_url=f"sqlite:///{path}")
        seed(settings, runs=20, seed=11, now=now)
        from agentledger.core.database import Database

        db = Database(settings.database_url)
        try:
            with db.read(transaction=True) as s:
                shapes.append(s.execute(
                    select(AgentRun.agent_id, AgentRun.status, AgentRun.created_at,
                           AgentRun.parent_run_id.is_(None))
                    .order_by(AgentRun.created_at, AgentRun.agent_id, AgentRun.status)).all())
                assert verify_chains(s).ok
        finally:
            db.dispose()
    assert shapes[0] == shapes[1]


def test_small_and_invalid_seeds(db, tmp_path):
    assert cli(db.url, "demo", "seed", "--runs", "1", "--seed", "1", cwd=tmp_path).returncode == 0
    assert describe(db)["roots"] == 1
    with pytest.raises(ValueError):
        seed(Settings(database_url=db.url), runs=0)
