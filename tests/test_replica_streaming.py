"""AGENTLEDGER_READ_DATABASE_URL against a real PostgreSQL streaming replica (a hot standby).

The module starts its own primary and a standby cloned from it with ``pg_basebackup -R`` (both
as the ``postgres`` OS user, in a temporary directory, on free ports), migrates the primary,
and runs a real ``agentledger serve`` (with its executor) whose reads may use the standby.

Lag is made deterministic by pausing replay on the standby (``pg_wal_replay_pause()``): every
write after the pause is missing there, so each read-your-writes check below would fail if
the read were served by the standby. Which server served reads is observed through the
standby's own table-access statistics (``pg_stat_user_tables``), which only reads of
agentledger's tables on the standby increase.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import requests
from support.ports import free_port
from support.processes import Api, ProcessManager, make_token
from support.waiting import wait_until

from agentledger.core.migrate import upgrade

pytestmark = pytest.mark.process

PG_BIN = Path("/usr/lib/postgresql/15/bin")
REPLICA_WARNING = "read replica unreachable"
REPLICA_RETRY_SECONDS = 1


def _can_run_clusters() -> str | None:
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL 15 binaries in {PG_BIN}"
    if os.geteuid() != 0:
        return "starting clusters as the postgres user needs root"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres OS user"
    return None


def _as_postgres(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(["runuser", "-u", "postgres", "--", *argv], capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}):\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


@dataclass
class Node:
    name: str
    data: Path
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname="postgres", autocommit=True, connect_timeout=5)

    def sql(self, statement: str, params=None):
        with self.connect() as conn:
            return conn.execute(statement, params).fetchall()

    def start(self) -> None:
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                     "-w", "-t", "60", "start")

    def stop(self) -> None:
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                     "-t", "60", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    @contextmanager
    def hung(self):
        """The server and every process of it stopped (SIGSTOP) inside the block: connections
        stay open and the host's kernel still acknowledges, but nothing answers, as with a
        frozen host or a network partition."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                                  text=True, timeout=10).stdout.split()
        pids = [postmaster, *map(int, children)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)


@dataclass
class Cluster:
    primary: Node
    standby: Node

    def replayed(self) -> bool:
        """The standby has replayed everything the primary has written."""
        (target,), = self.primary.sql("SELECT pg_current_wal_lsn()::text")
        (reached,), = self.standby.sql(
            "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))
        return bool(reached)

    def wait_replayed(self) -> None:
        wait_until(self.replayed, timeout=60, message="the standby to replay the primary's WAL")

    def pause(self) -> None:
        self.standby.sql("SELECT pg_wal_replay_pause()")
        wait_until(lambda: self.standby.sql("SELECT pg_get_wal_replay_pause_state()")[0][0]
                   == "paused", timeout=30, message="replay to pause")

    def resume(self) -> None:
        self.standby.sql("SELECT pg_wal_replay_resume()")

    def standby_table_reads(self) -> int:
        """Scans of agentledger's tables that the standby itself served (its own statistics)."""
        (count,), = self.standby.sql(
            "SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0)::bigint "
            "FROM pg_stat_user_tables")
        return count


def _configure(node: Node, socket_dir: Path, *, extra: str = "") -> None:
    with open(node.data / "postgresql.conf", "a") as conf:
        conf.write(
            f"\nport = {node.port}\n"
            "listen_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{socket_dir}'\n"
            "fsync = off\n"
            "max_connections = 100\n"
            "shared_buffers = 32MB\n"
            f"{extra}"
        )


@pytest.fixture(scope="module")
def cluster():
    reason = _can_run_clusters()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="agentledger-replica-"))
    postgres = pwd.getpwnam("postgres")
    os.chown(root, postgres.pw_uid, postgres.pw_gid)
    primary = Node("primary", root / "primary", free_port(), root / "primary.log")
    standby = Node("standby", root / "standby", free_port(), root / "standby.log")
    started: list[Node] = []
    try:
        _as_postgres(str(PG_BIN / "initdb"), "-D", str(primary.data), "-U", "postgres",
                     "--auth=trust", "-E", "UTF8", "--no-sync")
        _configure(primary, root, extra="wal_level = replica\nmax_wal_senders = 5\n")
        primary.start()
        started.append(primary)
        _as_postgres(str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
                     "-U", "postgres", "-D", str(standby.data), "-R", "-X", "stream",
                     "--no-sync")
        _configure(standby, root, extra="hot_standby = on\nhot_standby_feedback = on\n")
        standby.start()
        started.append(standby)
        assert standby.sql("SELECT pg_is_in_recovery()") == [(True,)]
        upgrade(primary.url)
        found = Cluster(primary, standby)
        found.wait_replayed()
        yield found
    finally:
        for node in reversed(started):
            try:
                if node.running():
                    node.stop()
            except Exception:  # noqa: BLE001 - stop the other one whatever happens
                _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(node.data), "-m", "immediate",
                             "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory):
    """``agentledger serve`` (with its executor): writes to the primary, reads may use the
    standby; a replica that cannot be reached is retried after one second."""
    with ProcessManager(tmp_path_factory.mktemp("replica-serve")) as manager:
        proc = manager.serve(
            cluster.primary.url, worker=True,
            AGENTLEDGER_READ_DATABASE_URL=cluster.standby.url,
            AGENTLEDGER_READ_REPLICA_RETRY_SECONDS=str(REPLICA_RETRY_SECONDS),
            AGENTLEDGER_RECONCILE_SECONDS="1",
        )
        api = Api(proc.base_url, make_token(cluster.primary.url))
        try:
            api.register_agent("echo", kind="echo")
            api.register_agent("leaf", params={"steps": [{"say": "leaf answer"}]})
            api.register_agent("boss", params={"steps": [
                {"say": "asking two "},
                {"delegate": [{"agent_id": "leaf", "input": "one"},
                              {"agent_id": "leaf", "input": "two"}]},
                {"say": "done"}]})
            cluster.wait_replayed()
            yield proc, api
        finally:
            api.close()


@contextmanager
def replay_paused(cluster: Cluster):
    """Replay stopped on the standby (everything written until then is there): every write
    inside the block is missing on the standby."""
    cluster.wait_replayed()
    cluster.pause()
    try:
        yield
        assert not cluster.replayed()  # the standby really lagged all along
    finally:
        cluster.resume()
        cluster.wait_replayed()


def _wait_terminal(api: Api, run_id: str) -> dict:
    def ended():
        found = api.get(f"/api/agent-runs/{run_id}")
        return found["status"] in ("succeeded", "failed", "cancelled", "interrupted") and found
    return wait_until(ended, timeout=60, message=lambda: f"run {run_id} to end")


def test_reads_are_served_by_the_caught_up_standby(cluster, server):
    _proc, api = server
    session_id = api.new_session("echo")
    cluster.wait_replayed()
    before = cluster.standby_table_reads()
    for _ in range(20):
        assert api.get(f"/api/sessions/{session_id}")["id"] == session_id
        assert api.get(f"/api/sessions/{session_id}/messages")["items"] == []
    # Backends publish their statistics when idle, within about ten seconds.
    wait_until(lambda: cluster.standby_table_reads() >= before + 20, timeout=30,
               message=lambda: f"standby reads to grow from {before} "
                               f"(now {cluster.standby_table_reads()})")
    (connections,), = cluster.standby.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
        "'agentledger-replica-read'")
    assert connections >= 1


def test_a_posted_message_is_in_the_list_read_right_after(cluster, server):
    _proc, api = server
    session_id = api.new_session("echo")  # on the standby too: only the messages lag
    with replay_paused(cluster):
        for n in range(10):
            content = f"message {n} {uuid.uuid4().hex}"
            run_id = api.send(session_id, content)
            listed = api.get(f"/api/sessions/{session_id}/messages?limit=200")["items"]
            assert content in [m["content"] for m in listed if m["role"] == "user"], (n, listed)
            assert api.get(f"/api/agent-runs/{run_id}")["id"] == run_id


def test_a_renamed_session_reads_its_new_title(cluster, server):
    _proc, api = server
    session_id = api.new_session("echo")
    with replay_paused(cluster):
        for n in range(10):
            title = f"title {n}"
            patched = api.call("PATCH", f"/api/sessions/{session_id}", json={"title": title},
                               expect=200).json()
            assert patched["title"] == title
            assert api.get(f"/api/sessions/{session_id}")["title"] == title
            listed = api.get("/api/sessions?limit=200")["items"]
            assert {s["id"]: s["title"] for s in listed}[session_id] == title


def test_a_run_that_delegates_to_two_children_completes_while_the_standby_lags(
        cluster, server):
    _proc, api = server
    session_id = api.new_session("boss")
    with replay_paused(cluster):
        root = api.send(session_id, "plan it")
        final = _wait_terminal(api, root)
        assert final["status"] == "succeeded", (final, api.events(root))
        nodes = api.tree(root)["nodes"]
        assert len(nodes) == 3 and {n["status"] for n in nodes} == {"succeeded"}, nodes


def test_an_event_stream_follows_a_run_while_the_standby_lags(cluster, server):
    from support.api import SSEStream

    proc, api = server
    session_id = api.new_session("boss")
    token = api.http.headers["Authorization"].split(" ", 1)[1]
    with replay_paused(cluster):
        run_id = api.send(session_id, "stream me")
        stream = SSEStream(proc.base_url, f"/api/agent-runs/{run_id}/events", token=token)
        try:
            assert stream.status in (200, 204), stream.status
            if stream.status == 200:
                kinds = [f.event for f in stream.read_to_end()]
                assert kinds[0] == "run.queued" and kinds[-1] == "run.completed", kinds
        finally:
            stream.close()
        assert api.get(f"/api/agent-runs/{run_id}")["status"] == "succeeded"


def _wait_served_by_standby(cluster: Cluster, api: Api, session_id: str) -> None:
    """Until reads of the server reach the standby again (once it is back and caught up)."""
    cluster.wait_replayed()
    before = cluster.standby_table_reads()

    def served_by_standby():
        for _ in range(5):
            assert api.call("GET", f"/api/sessions/{session_id}").status_code == 200
        return cluster.standby_table_reads() > before

    wait_until(served_by_standby, timeout=40, interval=0.5,
               message="reads to reach the standby again")


def test_a_stopped_standby_leaves_reads_to_the_primary_and_is_used_again_once_back(
        cluster, server):
    proc, api = server
    session_id = api.new_session("echo")
    cluster.wait_replayed()
    logged_before = len(proc.log())
    went_down = time.monotonic()
    cluster.standby.stop()
    try:
        started = time.monotonic()
        for n in range(20):
            reply = api.call("GET", f"/api/sessions/{session_id}")
            assert reply.status_code == 200, (n, reply.status_code, reply.text)
            assert api.call("GET", f"/api/sessions/{session_id}/messages").status_code == 200
        took = time.monotonic() - started
        assert took < 15, f"40 reads took {took:.1f}s with the standby down"
        run_id = api.send(session_id, "while the standby is down")
        assert _wait_terminal(api, run_id)["status"] == "succeeded"
        wait_until(lambda: REPLICA_WARNING in proc.log()[logged_before:], timeout=10,
                   message=lambda: f"the replica warning in the log:\n{proc.log()[-3000:]}")
    finally:
        cluster.standby.start()
    _wait_served_by_standby(cluster, api, session_id)
    warnings = proc.log()[logged_before:].count(REPLICA_WARNING)
    # one per back-off (AGENTLEDGER_READ_REPLICA_RETRY_SECONDS), not one per read: at most one
    # per retry period of the time the standby was away (measured: a slow machine stretches
    # it), plus one at either end
    unreachable = time.monotonic() - went_down
    assert 1 <= warnings <= unreachable / REPLICA_RETRY_SECONDS + 2, (warnings, unreachable)


def test_a_hung_standby_costs_requests_a_bounded_moment_not_the_server(cluster, server):
    # (a standby that stops answering without closing its connections used to hold every
    # request thread until it woke: health checks, reads and writes all hung)
    proc, api = server
    session_id = api.new_session("echo")
    cluster.wait_replayed()
    for _ in range(10):  # the replica's pool holds open connections when the standby hangs
        api.get(f"/api/sessions/{session_id}")
    headers = {"Authorization": api.http.headers["Authorization"]}

    def read(path: str) -> tuple[int, float]:
        started = time.monotonic()
        reply = requests.get(proc.base_url + path, headers=headers, timeout=30)
        return reply.status_code, time.monotonic() - started

    logged_before = len(proc.log())
    with cluster.standby.hung():
        started = time.monotonic()
        paths = [f"/api/sessions/{session_id}", f"/api/sessions/{session_id}/messages",
                 "/api/health", "/api/agent-runs?limit=5"] * 12
        with ThreadPoolExecutor(len(paths)) as pool:
            replies = list(pool.map(read, paths))
        assert [status for status, _ in replies] == [200] * len(paths), replies
        run_id = api.send(session_id, "while the standby hangs")
        assert _wait_terminal(api, run_id)["status"] == "succeeded"
        took = time.monotonic() - started
        # each read waits for the replica's check at most 2 s (more on a loaded machine)
        assert took < 20 and max(t for _, t in replies) < 15, (took, replies)
        assert REPLICA_WARNING in proc.log()[logged_before:]
    _wait_served_by_standby(cluster, api, session_id)


def test_a_statement_running_on_the_standby_when_it_hangs_ends_at_its_deadline(
        cluster, monkeypatch):
    # The deadline is the read statement_timeout plus the connect timeout: 3 s + 2 s here.
    from sqlalchemy import text

    from agentledger.core import database
    from agentledger.core.errors import ReplicaUnavailable

    monkeypatch.setattr(database, "READ_STATEMENT_TIMEOUT_MS", 3000)
    db = database.Database(cluster.primary.url, cluster.standby.url)
    try:
        cluster.wait_replayed()
        outcome: list = []

        def slow_read():
            started = time.monotonic()
            try:
                with db.read() as s:
                    s.execute(text("SELECT pg_sleep(2.5)"))
                outcome.append(("answered", time.monotonic() - started))
            except ReplicaUnavailable as exc:
                outcome.append((str(exc), time.monotonic() - started))

        def sleeping_on_standby() -> bool:
            return cluster.standby.sql(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                "AND query = 'SELECT pg_sleep(2.5)'")[0][0] == 1

        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(slow_read)
            wait_until(sleeping_on_standby, timeout=2, interval=0.02,
                       message="the statement to run on the standby")
            with cluster.standby.hung():  # while the statement runs
                done.result(timeout=30)
        [(what, took)] = outcome
        assert "went away during the read" in what and 4.5 < took < 12, outcome
    finally:
        db.dispose()
    cluster.wait_replayed()


def test_the_standby_given_as_the_primary_is_refused_in_one_line(cluster, tmp_path):
    # (db upgrade printed its revision, then a ReadOnlySqlTransaction traceback)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env.update(AGENTLEDGER_DATABASE_URL=cluster.standby.url, PYTHONWARNINGS="ignore")
    for command in (["db", "upgrade"], ["token", "create", "--owner", "ops"]):
        done = subprocess.run([sys.executable, "-m", "agentledger.cli", *command], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout) == (2, ""), done
        assert done.stderr == (
            f"agentledger: the database at {cluster.standby.url} (AGENTLEDGER_DATABASE_URL) is a "
            "read-only standby (in recovery): AGENTLEDGER_DATABASE_URL must name the primary; a "
            "standby can serve reads as AGENTLEDGER_READ_DATABASE_URL\n"), done.stderr
