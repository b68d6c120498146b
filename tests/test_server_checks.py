"""``serve`` and ``db upgrade`` warn when the PostgreSQL server does not maintain the tables
(autovacuum or track_counts off), and say nothing on SQLite or on a server that does."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from sqlalchemy import create_engine

from agentledger.core.server_checks import (
    AUTOVACUUM_DOC,
    maintenance_warning,
    settings_turned_off,
)

AGENTLEDGER = shutil.which("agentledger")


def _off_by_the_server(url: str) -> list[str]:
    """Read straight from the server with SHOW, not through the code under test."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [name for name in ("autovacuum", "track_counts")
                    if conn.exec_driver_sql(f"SHOW {name}").scalar_one() == "off"]
    finally:
        engine.dispose()


def test_sqlite_has_nothing_to_warn_about(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert settings_turned_off(url) == []
    assert maintenance_warning(url) is None


@pytest.mark.pg_only
def test_the_warning_names_exactly_the_settings_the_server_has_off(pg_url):
    off = _off_by_the_server(pg_url)
    assert settings_turned_off(pg_url) == off
    warning = maintenance_warning(pg_url)
    if not off:
        assert warning is None
        return
    assert warning is not None
    for name in off:
        assert name in warning
    assert AUTOVACUUM_DOC in warning and "VACUUM ANALYZE" in warning


@pytest.mark.pg_only
@pytest.mark.skipif(AGENTLEDGER is None, reason="the agentledger console script is not installed")
def test_db_upgrade_prints_the_warning_on_stderr_when_the_server_needs_it(pg_url):
    done = subprocess.run([AGENTLEDGER, "db", "upgrade"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "AGENTLEDGER_DATABASE_URL": pg_url})
    assert done.returncode == 0, done.stderr
    assert "database at revision" in done.stdout
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning: PostgreSQL's")]
    assert len(warned) == (1 if _off_by_the_server(pg_url) else 0)


@pytest.mark.pg_only
def test_serve_logs_the_warning_at_start_when_the_server_needs_it(pg_url, tmp_path):
    from support.api import ServerProcess

    server = ServerProcess(pg_url, tmp_path)
    try:
        warned = [line for line in server.log().splitlines()
                  if "PostgreSQL's" in line and AUTOVACUUM_DOC in line]
    finally:
        server.stop()
    # once, in the master, not once per worker
    assert len(warned) == (1 if _off_by_the_server(pg_url) else 0)
