"""Shared fixtures: the same tests run on a real SQLite file and a real PostgreSQL database.

PostgreSQL: one fresh database per test session (created from ``AGENTLEDGER_TEST_PG_URL``,
default ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``, migrated once, dropped at the
end), emptied with ``TRUNCATE`` before each test. When it cannot be reached the PostgreSQL leg is
skipped, unless ``AGENTLEDGER_REQUIRE_PG=1``, which turns that into a failure (CI sets it).

SQLite: one migrated file per session, copied into each test's own directory.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from agentledger.core.database import Database, normalize_url
from agentledger.core.migrate import upgrade

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
TABLES = (
    "run_event", "message", "agent_run", "chat_session", "conversation_thread",
    "agent_version", "agent", "context_blob", "api_token", "rate_limit_window",
    "agent_outcome_rollup", "agent_outcome_rollup_hour", "archived_run", "admin_action",
    "otlp_span", "otlp_conversation",
)


def _require_pg() -> bool:
    return os.environ.get("AGENTLEDGER_REQUIRE_PG") == "1"


def _libpq(url: str) -> str:
    return make_url(normalize_url(url)).set(drivername="postgresql").render_as_string(
        hide_password=False
    )


@pytest.fixture(scope="session")
def pg_database_url():
    """URL of this test session's own fresh PostgreSQL database (or skip / fail)."""
    admin_url = normalize_url(os.environ.get("AGENTLEDGER_TEST_PG_URL", DEFAULT_PG_URL))
    name = f"agentledger_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(_libpq(admin_url), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        message = f"PostgreSQL not reachable at {admin_url}: {exc}"
        if _require_pg():
            pytest.fail(message + " (AGENTLEDGER_REQUIRE_PG=1)", pytrace=False)
        pytest.skip(message)
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    with psycopg.connect(_libpq(admin_url), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


def _truncate(url: str) -> None:
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """A migrated, empty database of each kind; the test gets it to itself."""
    if request.param == "sqlite":
        target = tmp_path / "agentledger.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), target)
        return f"sqlite:///{target}"
    url = request.getfixturevalue("pg_database_url")
    _truncate(url)
    return url


@pytest.fixture
def pg_url(request) -> str:
    """PostgreSQL only, for behaviour that exists only there (SKIP LOCKED, LISTEN/NOTIFY)."""
    url = request.getfixturevalue("pg_database_url")
    _truncate(url)
    return url


@pytest.fixture
def db(db_url):
    database = Database(db_url)
    yield database
    database.dispose()


@pytest.fixture
def pg_db(pg_url):
    database = Database(pg_url)
    yield database
    database.dispose()


# ---- HTTP API tests (tests/test_api_*.py) -------------------------------------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_db_url(request, tmp_path_factory) -> str:
    """A migrated, empty database of each kind shared by one test module (server-process tests
    start one server per module and database; tests keep apart with their own sessions/keys)."""
    if request.param == "sqlite":
        target = tmp_path_factory.mktemp("module-db") / "agentledger.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), target)
        return f"sqlite:///{target}"
    url = request.getfixturevalue("pg_database_url")
    _truncate(url)
    return url


@pytest.fixture
def api(db, db_url):
    """The Flask app (no dashboards) on ``db``, with standard tokens and an ``echo`` agent."""
    from api_helpers import FlaskApi

    app = FlaskApi(db, db_url)
    yield app
    app.close()
