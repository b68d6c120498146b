"""Shared fixtures: the same tests run on a real SQLite file and a real PostgreSQL database.

PostgreSQL: one fresh database per test session (created from ``AGENTLEDGER_TEST_PG_URL``,
default ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``, migrated once, dropped at the
end), emptied before each test (``support.pg_reset``: a DELETE of every table, now and then a
``TRUNCATE``). When it cannot be reached the PostgreSQL leg is
skipped, unless ``AGENTLEDGER_REQUIRE_PG=1``, which turns that into a failure (CI sets it).

SQLite: one migrated file per session, copied into each test's own directory.

Markers from fixtures: a test whose fixtures start real processes (``ProcessManager``,
``ServerProcess``, ``subprocess``), a browser (Selenium ``webdriver``) or a soak loop (the
``soak_loop`` fixture) is marked ``process``, ``browser`` or ``soak``, and each of those also
``slow``, by ``pytest_collection_modifyitems``; ``python -m pytest -m "not slow"`` is the fast
tier. A test that waits out seconds of real time by design (a lease running out, an agent's 5 s
tool) or starts processes through a helper is marked ``slow`` or ``process`` by hand. Helpers live in ``tests/support/`` (see its ``__init__``).
"""

from __future__ import annotations

import inspect
import os
import shutil
import types
import uuid
from collections import Counter
from functools import cache
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url
from support import pg_reset, seeds
from support.tiers import COLLECTED, Collected

from agentledger.core.database import Database, normalize_url
from agentledger.core.migrate import upgrade

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


# ---- markers applied from fixtures --------------------------------------------------------------

# What a fixture's code names (globals and attributes, nested functions included) says it starts.
STARTS = {
    "process": frozenset({"ProcessManager", "ServerProcess", "Popen", "subprocess"}),
    "browser": frozenset({"webdriver", "Chrome"}),
}
# Fixtures that are a kind by themselves.
FIXTURE_KINDS = {"soak_loop": "soak", "procs": "process"}


def _names(code: types.CodeType) -> set[str]:
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _names(const)
    return found


@cache
def _kinds_of(func) -> frozenset[str]:
    if func is None:
        return frozenset()
    code = getattr(inspect.unwrap(func), "__code__", None)
    if code is None:
        return frozenset()
    names = _names(code)
    return frozenset(kind for kind, marks in STARTS.items() if names & marks)


def fixture_kinds(item: pytest.Item) -> set[str]:
    """``process`` / ``browser`` / ``soak`` for what ``item`` and its fixtures (all of them, the
    ones its fixtures request included) start."""
    kinds: set[str] = set(_kinds_of(getattr(item, "function", None)))  # the test's own body too
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return kinds
    for name, defs in info.name2fixturedefs.items():
        if name in FIXTURE_KINDS:
            kinds.add(FIXTURE_KINDS[name])
        for fixturedef in defs:
            kinds |= _kinds_of(fixturedef.func)
    return kinds


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """``-n logical`` (the suite's default) starts three workers for every two CPUs.

    A third of a worker's time goes to waiting (for a server to start, a lease to run out,
    PostgreSQL): with one worker per CPU a 2-CPU machine stayed 62 % busy over the whole suite,
    and a third worker finished it about a fifth sooner. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` (or
    ``-n N``) still chooses the number."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus * 3 // 2)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects anything
def pytest_collection_modifyitems(config, items):
    for item in items:
        kinds = fixture_kinds(item)
        for kind in sorted(kinds):
            item.add_marker(kind)
        if kinds:
            item.add_marker("slow")
        elif any(item.get_closest_marker(name) for name in ("process", "browser", "soak")):
            item.add_marker("slow")  # marked by hand: the same implication
    config.stash[COLLECTED] = Collected(
        modules=frozenset(item.nodeid.split("::")[0] for item in items), total=len(items),
        fast=sum(1 for item in items if not item.get_closest_marker("slow")))
    # The longest modules first: ``--dist loadfile`` hands modules to the workers in this order
    # (``--no-loadscope-reorder``: pytest-xdist would otherwise order them by test count, which
    # put the two-test soak module last), so the long ones start at once and the short ones fill
    # in at the end instead of one worker running the last long module while the others wait.
    # A soak test (minutes: the random lifecycles) outweighs any number of other slow tests.
    weight = Counter()
    for item in items:
        if item.get_closest_marker("soak"):
            weight[item.nodeid.split("::")[0]] += 1000
        elif item.get_closest_marker("slow"):
            weight[item.nodeid.split("::")[0]] += 1
    items.sort(key=lambda item: -weight[item.nodeid.split("::")[0]])


@pytest.fixture(scope="session")
def soak_loop():
    """The soak switch for a test that loops over many examples (marks it ``soak``/``slow``):
    ``soak_loop.soak(default, soaked)`` and ``soak_loop.seeded_random(name)``."""
    return seeds


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
    pg_reset.forget(_libpq(url))
    with psycopg.connect(_libpq(admin_url), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


def _truncate(url: str) -> None:
    """Empty every table of ``url`` (``support.pg_reset``: a DELETE of the few rows a test
    leaves, a TRUNCATE now and then)."""
    pg_reset.empty(_libpq(url))


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
def fw_db(db, db_url):
    """``db`` with the agent frameworks' own tables (LangGraph checkpoints, Agents SDK
    sessions), for runs of kinds ``langgraph`` and ``openai-agents``."""
    from agentledger.agent_kinds.storage import setup_framework_storage

    setup_framework_storage(db_url)
    return db


@pytest.fixture
def fw_executors(fw_db):
    """In-process executors on ``fw_db`` (``support.processes.ExecutorPool``)."""
    from support.processes import ExecutorPool

    with ExecutorPool(fw_db) as pool:
        yield pool


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
    from support.api import FlaskApi

    app = FlaskApi(db, db_url)
    yield app
    app.close()


@pytest.fixture
def procs(tmp_path):
    """Real ``agentledger`` processes of one test (``support.processes.ProcessManager``), all
    killed at teardown."""
    from support.processes import ProcessManager

    with ProcessManager(tmp_path) as manager:
        yield manager
