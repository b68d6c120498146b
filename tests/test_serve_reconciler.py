"""``agentledger serve`` always reconciles (CONTRACT §4), also with ``--no-worker``.

In the scale-out deployment (``serve --no-worker`` plus ``agentledger worker`` processes) the
workers' own reconcilers die with them: when the only worker is killed, the server's reconciler
must end its runs ``interrupted`` (``lease_expired``) once the lease is over. ``--no-reconciler``
turns that off (the run then waits for an ``agentledger reconcile``). Short leases (3 s,
heartbeat 1 s, reconcile 1 s) make a dead worker show quickly; deadlines are generous.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from support.ports import free_port
from support.processes import (
    Api,
    ProcessManager,
    assert_one_terminal_event,
    make_token,
    status,
    types,
    wait_terminal,
    wait_until,
)

from agentledger.core.config import Settings
from agentledger.server import default_workers

LEASE, HEARTBEAT, RECONCILE = 3, 1, 1
FAST = {"AGENTLEDGER_LEASE_SECONDS": str(LEASE), "AGENTLEDGER_HEARTBEAT_SECONDS": str(HEARTBEAT),
        "AGENTLEDGER_RECONCILE_SECONDS": str(RECONCILE)}
SLEEPER = {"steps": [{"say": "on it "}, {"sleep": 60}, {"say": "done"}]}


@pytest.fixture
def procs(tmp_path):
    with ProcessManager(tmp_path) as manager:
        yield manager


def _running_with_output(db, run_id: str) -> bool:
    return status(db, run_id) == "running" and "message.delta" in types(db, run_id)


def _kill_the_only_worker_mid_run(procs, db_url, db, server_args: tuple[str, ...]):
    server = procs.serve(db_url, args=server_args, default_workers=True, **FAST)
    worker = procs.worker(db_url, "only-worker", **FAST)
    api = Api(server.base_url, make_token(db_url))
    try:
        api.register_agent("sleeper", params=SLEEPER)
        run_id = api.send(api.new_session("sleeper"), "a long job")
    finally:
        api.close()
    wait_until(lambda: _running_with_output(db, run_id), timeout=30,
               message=lambda: f"the run to be running: {status(db, run_id)}\n{procs.logs()}")
    worker.kill_group(signal.SIGKILL)
    assert worker.wait(10) == -signal.SIGKILL
    return server, run_id


@pytest.mark.slow
def test_serve_without_worker_interrupts_the_runs_of_a_killed_worker(pg_url, pg_db, procs):
    server, run_id = _kill_the_only_worker_mid_run(procs, pg_url, pg_db, ("--no-worker",))
    # the default on PostgreSQL: one HTTP worker process per CPU core, each reconciling
    assert re.search(rf"\b{default_workers(Settings(database_url=pg_url))} HTTP worker "
                     rf"process\(es\); in each: no executor, reconciler every 1s", server.log())
    wait_terminal(pg_db, [run_id], timeout=LEASE + 30)
    terminal = assert_one_terminal_event(pg_db, run_id)
    assert terminal.type == "run.interrupted"
    assert terminal.data["reason"] == "lease_expired"
    assert terminal.data["executor_instance_id"] == "only-worker"
    assert "run.completed" not in types(pg_db, run_id)  # nothing re-ran the model


@pytest.mark.slow
def test_no_reconciler_leaves_the_run_to_agentledger_reconcile(pg_url, pg_db, procs):
    server, run_id = _kill_the_only_worker_mid_run(
        procs, pg_url, pg_db, ("--no-worker", "--no-reconciler"))
    assert "in each: no executor, no reconciler" in server.log()
    # Nothing in this deployment reconciles: well after the lease, the run is still running.
    watch_until = time.monotonic() + LEASE + 4 * RECONCILE
    while time.monotonic() < watch_until:
        assert status(pg_db, run_id) == "running"
        time.sleep(0.2)
    done = procs.run(["reconcile", "--once"], procs.environment(pg_url, **FAST))
    assert done.returncode == 0, done.stdout + done.stderr
    assert assert_one_terminal_event(pg_db, run_id).data["reason"] == "lease_expired"


def test_workers_default_to_one_per_core_on_postgresql_and_one_on_sqlite():
    assert default_workers(Settings(database_url="sqlite:///x.db")) == 1
    cores = os.cpu_count() or 1
    assert default_workers(Settings(database_url="postgresql+psycopg://u@h/d")) == cores


@pytest.mark.parametrize("lease, heartbeat", [("5", "5"), ("5", "10")])
def test_a_heartbeat_not_below_the_lease_is_refused_at_start(procs, lease, heartbeat, tmp_path):
    env = procs.environment(f"sqlite:///{tmp_path / 'x.db'}", AGENTLEDGER_LEASE_SECONDS=lease,
                            AGENTLEDGER_HEARTBEAT_SECONDS=heartbeat)
    for command in (["worker"], ["serve", "--port", str(free_port())], ["reconcile", "--once"]):
        done = procs.run(command, env)
        assert done.returncode != 0, command
        assert "AGENTLEDGER_HEARTBEAT_SECONDS" in done.stderr and "below" in done.stderr, done.stderr


def test_a_heartbeat_below_the_lease_is_accepted(monkeypatch):
    monkeypatch.setenv("AGENTLEDGER_LEASE_SECONDS", "2")
    monkeypatch.setenv("AGENTLEDGER_HEARTBEAT_SECONDS", "0.5")
    settings = Settings.from_env()
    assert (settings.lease_seconds, settings.heartbeat_seconds) == (2.0, 0.5)
