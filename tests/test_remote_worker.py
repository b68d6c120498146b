"""``agentledger worker --api URL --token TOKEN``: a worker that reaches the ledger only through
a server's executor routes. Its ``AGENTLEDGER_DATABASE_URL`` points at a database that does not
exist, so any database access would fail the runs; the server (``serve --no-worker``) owns the
database and its reconciler watches the remote worker's leases (short ones here).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from support.processes import (
    Api,
    ProcessManager,
    assert_one_terminal_event,
    make_token,
    message_content,
    run,
    runs,
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


@pytest.mark.parametrize("role", [None, "user", "viewer"])
def test_a_worker_whose_token_the_server_refuses_exits_saying_so(db, db_url, cluster, procs,
                                                                role):
    """An unknown token (401) or one of another role (403) is a configuration mistake, not a
    hiccup: the worker stops at once with one line on stderr and status 2, instead of retrying
    forever."""
    token = "al_not_a_token" if role is None else make_token(db_url, owner="someone", role=role)
    done = procs.run(["worker", "--api", cluster["server"].base_url, "--token", token,
                      "--instance-id", "refused"],
                     procs.environment(UNUSABLE_DATABASE, **timing(SAFE_LEASE)), timeout=30)
    assert done.returncode == 2, (done.stdout, done.stderr)
    code = "unauthenticated" if role is None else "forbidden"
    lines = [line for line in done.stderr.splitlines() if "agentledger worker:" in line]
    assert len(lines) == 1 and f"refuses this token ({code}:" in lines[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize("over_http", [False, True], ids=["database", "api"])
def test_a_worker_whose_claims_the_ledger_refuses_exits_saying_so(db_url, cluster, procs,
                                                                  over_http):
    """A claim refused for its own terms (here an instance id under the prefix of recorded
    runs, which the command's argument check would stop before: the worker's function is
    called directly) is refused again at every try: the worker stops with one line on stderr
    and status 2, instead of staying up without claiming."""
    api = (f", api_url={cluster['server'].base_url!r}, token="
           f"{make_token(db_url, owner='refused-exec', role='executor')!r}" if over_http else "")
    code = ("import sys; from agentledger.core.config import Settings;"
            " from agentledger.worker.process import run_worker_process;"
            " sys.exit(run_worker_process(Settings.from_env(), instance_id='otlp:checkout',"
            f" concurrency=1{api}))")
    env = procs.environment(UNUSABLE_DATABASE if over_http else db_url, **timing(SAFE_LEASE))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=procs.dir,
                          capture_output=True, text=True, timeout=60, start_new_session=True)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if "agentledger worker:" in line]
    assert len(lines) == 1, done.stderr
    assert "refuses this worker's claims (validation_error:" in lines[0], lines
    assert "must not start with 'otlp:'" in lines[0], lines
    assert "Traceback" not in done.stderr + done.stdout


def _claims_answered(api) -> float:
    text = api.call("GET", "/metrics", expect=200).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("agentledger_http_request_duration_seconds_count")
               and 'route="/api/executor/claim"' in line)


def test_an_idle_remote_worker_claims_without_polling_and_starts_a_run_at_once(db, cluster):
    """The worker's claims wait on the server for work: an idle worker sends about one claim a
    second (polling every 0.5 s sent two), and a run starts as it is queued, not at the next
    poll. httpx's line per request stays out of the worker's log."""
    api, worker = cluster["api"], cluster["worker"]
    api.register_agent("echo", kind="echo")
    proc = worker("remote-idle", concurrency=1)
    before = _claims_answered(api)
    time.sleep(4)
    assert _claims_answered(api) - before <= 6  # 4-5 waits of a second; polling made 8
    run_id = api.send(api.new_session("echo"), "ping")
    wait_for_status(db, run_id, "succeeded", timeout=30)
    assert "HTTP Request" not in proc.log()


def test_a_waiting_claim_is_answered_as_soon_as_a_run_is_queued(db_url, cluster):
    """What starts a run on an idle worker is the server's wake-up, not the end of the claim's
    wait: with the longest wait a claim may ask for (5 s) the run is claimed well before it
    would have ended (a bound that holds on a loaded machine; the worker's own wait is 1 s,
    too short to tell the two apart on one)."""
    from agentledger.api.requests import MAX_CLAIM_WAIT_SECONDS
    from agentledger.client import ExecutorClient
    from agentledger.worker.http_backend import HttpBackend

    api = cluster["api"]
    api.register_agent("echo", kind="echo")
    token = make_token(db_url, owner="remote-exec", role="executor")
    claimed: dict = {}

    def claim_until_a_run() -> None:
        with ExecutorClient(cluster["server"].base_url, token, "remote-waiting") as client:
            backend = HttpBackend(client, claim_wait_seconds=MAX_CLAIM_WAIT_SECONDS)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                runs = backend.claim(1, SAFE_LEASE)
                if runs:
                    claimed.update(at=time.monotonic(), run_id=runs[0].run_id)
                    return

    claimer = threading.Thread(target=claim_until_a_run)
    claimer.start()
    time.sleep(0.5)  # the claim waits on the server (had it not arrived yet, it takes the run)
    queued = time.monotonic()
    run_id = api.send(api.new_session("echo"), "ping")
    claimer.join(60)
    assert claimed["run_id"] == run_id
    # Unwoken, the claim would have been answered about 4.5 s after the run was queued.
    assert claimed["at"] - queued < 0.6 * MAX_CLAIM_WAIT_SECONDS, claimed["at"] - queued


def test_a_worker_polls_a_server_that_does_not_hold_claims():
    """A server without ``wait_seconds`` (an older version) refuses the field: the worker claims
    without it from then on and paces its claims itself, every 0.5 s."""
    import httpx

    from agentledger.client import ExecutorClient
    from agentledger.worker.http_backend import HttpBackend

    bodies: list[dict] = []

    def older_server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if "wait_seconds" in body:
            return httpx.Response(422, json={"error": {
                "code": "validation_error", "message": "wait_seconds: is not an accepted field"}})
        return httpx.Response(200, json={"runs": []})

    client = ExecutorClient("http://ledger.test", "t", "old-server",
                            transport=httpx.MockTransport(older_server))
    backend = HttpBackend(client)
    assert backend.notifier.queue_poll_seconds == 0  # the claims wait on the server
    assert backend.claim(1, 30) == [] and backend.claim(1, 30) == []
    assert [b.get("wait_seconds") for b in bodies] == [1.0, None, None]
    assert backend.notifier.queue_poll_seconds == 0.5
    started = time.monotonic()
    backend.notifier.wait_for_queue(backend.notifier.queue_generation(), 5)
    assert 0.4 < time.monotonic() - started < 2


def test_an_unreachable_server_is_logged_once_not_once_a_claim(procs):
    """The claim loop retries an unreachable server every second; its log says so once (and
    every 30 s while it lasts), without a traceback per try."""
    proc = procs.start("unreachable", ["worker", "--api", "http://127.0.0.1:1", "--token", "t",
                                       "--instance-id", "lonely"],
                       procs.environment(UNUSABLE_DATABASE))
    proc.wait_for_log("claims failed")
    time.sleep(4)  # about three more tries
    proc.send(signal.SIGTERM)
    assert proc.wait(15) == 0
    log = proc.log()
    assert log.count("claims failed") == 1 and "still failing" not in log, log
    assert "Traceback" not in log and "HTTP Request" not in log, log


def test_sigterm_interrupts_every_run_the_worker_holds_parents_waiting_on_children_too(db, cluster):
    """Parents waiting on their children (which run on the same worker) see the stop at once and
    let go of their runs before the worker's loops have stopped; they are still the worker's to
    end: every run it held ends ``executor_shutdown`` at once (not ``lease_expired`` a lease
    later), with one terminal event, and the worker does not report them as lost."""
    api, worker = cluster["api"], cluster["worker"]
    api.register_agent("sleeper", params={"steps": [{"say": "on it "}, {"sleep": 60}]})
    api.register_agent("boss", params={"steps": [
        {"say": "splitting "}, {"delegate": [{"agent_id": "sleeper", "input": "a"},
                                             {"agent_id": "sleeper", "input": "b"}]},
        {"say": "joined"}]})
    # Five slots: the four children take four (their waiting parents gave theirs back) and the
    # claim loop waits on the server with the fifth when the worker is told to stop.
    proc = worker("remote-s", concurrency=5)
    parents = [api.send(api.new_session("boss"), f"task {i}") for i in range(2)]

    def held():
        nodes = [n for p in parents for n in runs(db, root_run_id=p)]
        children = [n for n in nodes if n.parent_run_id is not None]
        if len(children) == 4 and all("message.delta" in types(db, c.id) for c in children):
            return [n.id for n in nodes]
        return None

    run_ids = wait_until(held, timeout=30)
    assert [status(db, r) for r in run_ids] == ["running"] * 6
    proc.send(signal.SIGTERM)
    told = time.monotonic()
    wait_terminal(db, run_ids, timeout=SAFE_LEASE / 2)
    assert time.monotonic() - told < SAFE_LEASE / 2
    assert proc.wait(15) == 0
    for run_id in run_ids:
        terminal = assert_one_terminal_event(db, run_id)
        assert terminal.data == {"reason": "executor_shutdown", "executor_instance_id": "remote-s"}
    log = proc.log()
    assert "stopped; 6 run(s) interrupted (executor_shutdown)" in log, log
    assert "no longer ours" not in log and "could not record" not in log, log


# The server stays down longer than any fixed retry budget short of a lease would allow (25 s),
# and a new serve process takes over 10 s to answer on a slow, busy machine (the full suite on
# two slow cores): the lease outlasts both, since this test is about a restart inside the lease,
# not about one that outlasts it (that run ends lease_expired, as it should).
RESTART_DOWN_SECONDS, RESTART_LEASE = 25, 75


@pytest.mark.parametrize("lease", [RESTART_LEASE])
def test_a_run_goes_on_when_its_server_restarts_while_it_works(db, db_url, cluster, procs, lease):
    """The server is killed while a remote worker's run sleeps, and is back half a minute
    later: the write the run makes meanwhile never reached the server, so it is tried again
    while the lease may hold, and the run ends as it would have, with every word of it."""
    api, worker = cluster["api"], cluster["worker"]
    api.register_agent("patient", params={"steps": [
        {"say": "one "}, {"sleep": 4}, {"say": "two "}, {"sleep": 1}, {"say": "three"}]})
    proc = worker("remote-patient", concurrency=1)
    run_id = api.send(api.new_session("patient"), "go")
    wait_until(lambda: "message.delta" in types(db, run_id), timeout=30)
    # The server is killed while the run sleeps, not while the answer to "one " is on its way:
    # an append whose answer was lost may have been written, and is not sent again.
    time.sleep(1)
    server = cluster["server"]
    server.kill_group()
    server.wait(10)
    time.sleep(RESTART_DOWN_SECONDS)  # "two " is written while the server is down
    procs.serve(db_url, port=server.port, **timing(lease))
    wait_terminal(db, [run_id], timeout=90)
    assert status(db, run_id) == "succeeded", (assert_one_terminal_event(db, run_id).data,
                                               proc.log()[-4000:])
    assert message_content(db, run(db, run_id).final_message_id) == "one two three"
