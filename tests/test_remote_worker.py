"""``agentledger worker --api URL --token TOKEN``: a worker that reaches the ledger only through
a server's executor routes. Its ``AGENTLEDGER_DATABASE_URL`` points at a database that does not
exist, so any database access would fail the runs; the server (``serve --no-worker``) owns the
database and its reconciler watches the remote worker's leases (short ones here).
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from support.processes import (
    Api,
    ProcessManager,
    assert_one_terminal_event,
    make_token,
    message_content,
    run,
    status,
    types,
    wait_for_status,
    wait_terminal,
    wait_until,
)

# The killed-worker test uses a short lease; the others a longer one, so that a heartbeat late on
# a loaded machine does not end their runs ``lease_expired`` first.
LEASE, HEARTBEAT, RECONCILE = 3, 1, 1
SAFE_LEASE = 15


def timing(lease: float) -> dict[str, str]:
    return {"AGENTLEDGER_LEASE_SECONDS": str(lease), "AGENTLEDGER_HEARTBEAT_SECONDS": str(HEARTBEAT),
            "AGENTLEDGER_RECONCILE_SECONDS": str(RECONCILE)}
# Nothing listens on port 1: a worker that touched the database would fail at once.
UNUSABLE_DATABASE = "postgresql+psycopg://nobody@127.0.0.1:1/no_such_database?connect_timeout=1"


@pytest.fixture
def procs(tmp_path):
    with ProcessManager(tmp_path) as manager:
        yield manager


@pytest.fixture
def lease() -> float:
    return SAFE_LEASE


@pytest.fixture
def cluster(db_url, procs, lease):
    server = procs.serve(db_url, **timing(lease))
    api = Api(server.base_url, make_token(db_url))
    executor_token = make_token(db_url, owner="remote-exec", role="executor")

    def worker(name: str, *, concurrency: int = 2):
        proc = procs.start(name, ["worker", "--api", server.base_url, "--token", executor_token,
                                  "--instance-id", name, "--concurrency", str(concurrency)],
                           procs.environment(UNUSABLE_DATABASE, **timing(lease)))
        proc.wait_for_log(rf"worker {re.escape(name)} executing")
        return proc

    yield {"server": server, "api": api, "worker": worker}
    api.close()


def test_remote_worker_executes_echo_scripted_and_delegating_runs(db, cluster):
    api, worker = cluster["api"], cluster["worker"]
    api.register_agent("echo", kind="echo")
    api.register_agent("tooly", params={"steps": [
        {"say": "Looking it up: "}, {"tool": "search", "input": {"q": "{input}"},
                                     "output": {"hits": 3}},
        {"usage": {"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.001}},
        {"say": "{input}!"}]})
    api.register_agent("boss", params={"steps": [
        {"say": "splitting "}, {"delegate": [{"agent_id": "echo", "input": "left {input}"},
                                             {"agent_id": "tooly", "input": "right"}]},
        {"say": "joined"}]})
    proc = worker("remote-a", concurrency=1)  # one slot: the parent lends it to its children
    echo_run = api.send(api.new_session("echo"), "ping")
    tool_run = api.send(api.new_session("tooly"), "weather")
    boss_run = api.send(api.new_session("boss"), "work")
    wait_terminal(db, [echo_run, tool_run, boss_run], timeout=60)

    assert message_content(db, run(db, echo_run).final_message_id) == "ping"
    assert message_content(db, run(db, tool_run).final_message_id) == "Looking it up: weather!"
    assert types(db, tool_run)[2:] == ["message.delta", "tool.call", "tool.result", "usage",
                                       "message.delta", "run.completed"]
    nodes = api.tree(boss_run)["nodes"]
    assert [n["status"] for n in nodes] == ["succeeded"] * 3
    assert message_content(db, run(db, boss_run).final_message_id) == "splitting joined"
    children = [n["run_id"] for n in nodes[1:]]
    assert message_content(db, run(db, children[0]).final_message_id) == "left work"
    for run_id in [echo_run, tool_run, boss_run, *children]:
        assert_one_terminal_event(db, run_id)
        assert run(db, run_id).executor_instance_id == "remote-a"
    boss_types = types(db, boss_run)
    assert boss_types.count("run.child_created") == 2 and boss_types.count("run.child_finished") == 2
    assert proc.alive() and "Traceback" not in proc.log()


def test_remote_worker_honours_cancel(db, cluster):
    api, worker = cluster["api"], cluster["worker"]
    api.register_agent("sleeper", params={"steps": [{"say": "on it "}, {"sleep": 60},
                                                    {"say": "done"}]})
    worker("remote-c")
    run_id = api.send(api.new_session("sleeper"), "x")
    wait_until(lambda: "message.delta" in types(db, run_id), timeout=30)
    asked = time.monotonic()
    assert api.post(f"/api/agent-runs/{run_id}/cancel", expect=202).json()["status"] == "cancelling"
    wait_for_status(db, run_id, "cancelled", timeout=10)
    # well before the 60 s step would have ended (the contract's bound is 1 s; the deadline
    # here is generous for a loaded machine)
    assert time.monotonic() - asked < 10
    terminal = assert_one_terminal_event(db, run_id)
    assert terminal.type == "run.cancelled"
    assert terminal.data["external_stop_confirmed"] is True
    kinds = types(db, run_id)
    assert kinds.index("run.cancelling") < kinds.index("run.cancelled")
    assert "run.completed" not in kinds


@pytest.mark.parametrize("lease", [LEASE])
def test_a_killed_remote_worker_s_run_is_interrupted_by_the_server_after_its_lease(db, cluster):
    api, worker = cluster["api"], cluster["worker"]
    api.register_agent("sleeper", params={"steps": [{"say": "on it "}, {"sleep": 60}]})
    proc = worker("remote-k")
    run_id = api.send(api.new_session("sleeper"), "x")
    wait_until(lambda: "message.delta" in types(db, run_id), timeout=30)
    proc.kill_group(signal.SIGKILL)
    assert proc.wait(5) == -signal.SIGKILL
    assert status(db, run_id) == "running"  # nobody writes for a dead worker until its lease ends
    wait_terminal(db, run_id, timeout=LEASE + 4 * RECONCILE + 10)
    terminal = assert_one_terminal_event(db, run_id)
    assert terminal.data["reason"] == "lease_expired"
    assert terminal.data["executor_instance_id"] == "remote-k"


def test_sigterm_ends_a_remote_worker_s_runs_with_executor_shutdown(db, cluster):
    api, worker = cluster["api"], cluster["worker"]
    api.register_agent("sleeper", params={"steps": [{"say": "on it "}, {"sleep": 60}]})
    proc = worker("remote-t", concurrency=2)
    run_ids = [api.send(api.new_session("sleeper"), "x") for _ in range(2)]
    wait_until(lambda: all("message.delta" in types(db, r) for r in run_ids), timeout=30)
    proc.send(signal.SIGTERM)
    wait_terminal(db, run_ids, timeout=10)
    assert proc.wait(15) == 0
    for run_id in run_ids:
        terminal = assert_one_terminal_event(db, run_id)
        assert terminal.data == {"reason": "executor_shutdown", "executor_instance_id": "remote-t"}
    assert "stopped; 2 run(s) interrupted (executor_shutdown)" in proc.log()


def test_worker_api_needs_a_token_and_an_http_url(db_url, procs):
    env = procs.environment(UNUSABLE_DATABASE)
    done = procs.run(["worker", "--api", "http://127.0.0.1:1"], env)
    assert done.returncode != 0 and "--api and --token go together" in done.stderr
    done = procs.run(["worker", "--api", "ftp://x", "--token", "t"], env)
    assert done.returncode != 0 and "http:// or https://" in done.stderr
