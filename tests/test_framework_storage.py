"""The frameworks' own tables live in the ledger database: ``agentledger db upgrade`` creates
them (fresh and existing databases, SQLite and PostgreSQL) with the frameworks' own ``setup()``;
the base package never imports a framework until an agent of its kind is used."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import create_engine, inspect, text
from support.ledger import fresh_database
from support.processes import ProcessManager

from agentledger.core.database import normalize_url

FRAMEWORK_TABLES = {
    "sqlite": {"checkpoints", "writes", "agent_sessions", "agent_messages"},
    "postgresql": {"checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations",
                   "agent_sessions", "agent_messages"},
}


def tables(url: str) -> set[str]:
    engine = create_engine(normalize_url(url))
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request, tmp_path):
    if request.param == "postgresql":
        request.getfixturevalue("pg_database_url")
    with fresh_database(request.param, tmp_path) as url:
        yield request.param, url


def test_db_upgrade_creates_the_framework_tables_on_a_fresh_database(fresh_url, tmp_path):
    dialect, url = fresh_url
    with ProcessManager(tmp_path) as procs:
        env = procs.environment(url)
        for _ in range(2):  # and running it again changes nothing
            done = procs.run(["db", "upgrade"], env)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "framework tables ready: langgraph, openai-agents" in done.stdout
    found = tables(url)
    assert FRAMEWORK_TABLES[dialect] <= found
    assert {"agent_run", "run_event"} <= found


def test_db_upgrade_adds_them_to_an_existing_database(db_url, tmp_path):
    dialect = "sqlite" if db_url.startswith("sqlite") else "postgresql"
    engine = create_engine(normalize_url(db_url))
    try:
        with engine.begin() as conn:
            # A set has no order and the Agents SDK's tables reference each other, so
            # PostgreSQL drops the dependants with CASCADE; SQLite does not enforce them here.
            cascade = " CASCADE" if dialect == "postgresql" else ""
            for table in FRAMEWORK_TABLES[dialect]:
                conn.execute(text(f"DROP TABLE IF EXISTS {table}{cascade}"))
    finally:
        engine.dispose()
    assert not FRAMEWORK_TABLES[dialect] & tables(db_url)
    with ProcessManager(tmp_path) as procs:
        done = procs.run(["db", "upgrade"], procs.environment(db_url))
    assert done.returncode == 0, done.stdout + done.stderr
    assert FRAMEWORK_TABLES[dialect] <= tables(db_url)


def test_the_base_package_does_not_import_the_frameworks():
    code = ("import sys, agentledger.agent_kinds, agentledger.cli, agentledger.worker.executor;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('langgraph', 'langchain_core', 'agents', 'openai')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_start_on_a_set_up_database_does_not_import_the_agents_sdk(fresh_url):
    """Once its tables exist the SDK's setup has nothing to do; every ``serve``, worker and
    ``db upgrade`` start would otherwise import it (seconds of CPU) only to learn that."""
    _, url = fresh_url
    code = ("import sys; from agentledger.agent_kinds.storage import setup_framework_storage;"
            f"print(setup_framework_storage({url!r}));"
            "print('agents' in sys.modules)")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    assert all(done.returncode == 0 for done in runs), [done.stderr for done in runs]
    first, again = (done.stdout.split("\n")[:2] for done in runs)
    assert first == ["['langgraph', 'openai-agents']", "True"]  # created with the SDK's setup
    assert again == ["['langgraph', 'openai-agents']", "False"]
    assert {"agent_sessions", "agent_messages"} <= tables(url)
