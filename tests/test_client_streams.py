"""``LedgerClient.wait`` and ``stream_events`` against a real server that is slow, silent,
unreachable or restarted, on SQLite and PostgreSQL.

One ``agentledger serve --no-worker`` per database, with a keep-alive comment every
``KEEPALIVE`` seconds on an idle stream; the tests execute runs by hand through
``ExecutorClient`` (claim, append), so each event arrives exactly when the test says. Outages
come from killing the server's process group (``kill -9``) and starting it again on the same
port and database, or from ``OutageProxy``, a ``FaultProxy`` that drops every connection and
closes each new one at once for as long as the outage lasts.
"""

from __future__ import annotations

import threading
import time

import pytest
from support.api import STANDARD_TOKENS, make_tokens, unique
from support.factories import make_agent
from support.fault_proxy import FaultProxy, _close
from support.processes import ProcessManager
from support.waiting import wait_until

from agentledger.client import ConnectionFailed, ExecutorClient, LedgerClient
from agentledger.core.database import Database

KEEPALIVE = 3.0
# The server's ``retry:`` hint (agentledger.api.stream.RETRY_MS), the least pause between two
# reconnect attempts that fail.
RETRY_HINT = 2.0
# What a deadline may be overrun by on a loaded machine (the thread that notices it has to run).
LATE = 1.0


class Server:
    """A server that can be crashed and started again on the same port and database."""

    def __init__(self, manager: ProcessManager, db_url: str):
        self.manager = manager
        self.db_url = db_url
        self.proc = self._serve(None)
        assert self.proc.port is not None and self.proc.base_url is not None
        self.port: int = self.proc.port
        self.url: str = self.proc.base_url

    def _serve(self, port: int | None):
        return self.manager.serve(self.db_url, port=port, threads=None,
                                  AGENTLEDGER_SECRET_KEY="client-streams-secret",
                                  AGENTLEDGER_SSE_KEEPALIVE_SECONDS=str(KEEPALIVE))

    def crash_and_restart(self, down: float) -> float:
        """``kill -9`` of the whole server, ``down`` seconds, a new server; the seconds it was
        unreachable."""
        crashed = time.monotonic()
        self.proc.kill_group()
        self.proc.wait(10)
        time.sleep(down)
        self.proc = self._serve(self.port)
        return time.monotonic() - crashed


@pytest.fixture(scope="module")
def server(module_db_url, tmp_path_factory):
    db = Database(module_db_url)
    tokens = make_tokens(db, STANDARD_TOKENS)
    make_agent(db, "echo", name="Echo")
    with ProcessManager(tmp_path_factory.mktemp("client-streams")) as manager:
        yield {"server": Server(manager, module_db_url), "tokens": tokens}
    db.dispose()


@pytest.fixture
def alice(server):
    with LedgerClient(server["server"].url, server["tokens"]["alice"]) as client:
        yield client


@pytest.fixture
def executor(server):
    with ExecutorClient(server["server"].url, server["tokens"]["executor"],
                        unique("streams")) as client:
        yield client


def started_run(alice: LedgerClient, executor: ExecutorClient) -> str:
    """A new run of alice's, claimed by ``executor`` (with a lease that outlasts the test);
    runs of earlier tests that it claims on the way are completed."""
    session = alice.create_session("echo")
    run_id = alice.send_message(session["id"], "hello")["run_id"]
    claimed: list[dict] = []
    wait_until(lambda: claimed.extend(executor.claim(max_runs=100, lease_seconds=600)) or
               any(r["run_id"] == run_id for r in claimed), timeout=30)
    for other in claimed:
        if other["run_id"] != run_id:
            executor.append(other["run_id"], [("run.completed", {})])
    return run_id


class Reader:
    """``stream_events`` (or ``wait``) of one run in a thread: ``events`` as they arrive, then
    ``result`` or ``error``, ``ended_at`` (``time.monotonic()`` in its thread) and
    ``ended_after`` (seconds from the start)."""

    def __init__(self, call):
        self.events: list[dict] = []
        self.result = None
        self.error: BaseException | None = None
        self.ended_after: float | None = None
        self.ended_at: float | None = None
        self._call = call
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._call(self.events.append)
        except BaseException as exc:  # handed to the test
            self.error = exc
        self.ended_at = time.monotonic()
        self.ended_after = self.ended_at - self._started

    @classmethod
    def stream(cls, client: LedgerClient, run_id: str) -> Reader:
        def call(seen):
            for event in client.stream_events(run_id):
                seen(event)
        return cls(call)

    def join(self, timeout: float = 120) -> Reader:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the reader never ended"
        return self

    def saw(self, event_type: str) -> bool:
        return any(e["type"] == event_type for e in self.events)


def assert_the_stored_stream(alice: LedgerClient, run_id: str, streamed: list[dict]) -> None:
    stored = alice.events(run_id, limit=500)["events"]
    assert streamed == stored
    assert [e["seq"] for e in streamed] == list(range(1, len(streamed) + 1))
    assert streamed[-1]["type"] == "run.completed"


def _elapsed(call) -> tuple[float, BaseException]:
    started = time.monotonic()
    with pytest.raises((TimeoutError, ConnectionFailed)) as caught:
        call()
    return time.monotonic() - started, caught.value


# ---- wait keeps its timeout -----------------------------------------------------------------


def test_wait_times_out_on_time_while_events_keep_arriving(alice, executor):
    run_id = started_run(alice, executor)
    stop = threading.Event()

    def chatter():
        for _ in range(40):  # 10 s at most, should the wait not end
            if stop.wait(0.25):
                return
            executor.append(run_id, [("message.delta", {"text": "x"})])

    feeder = threading.Thread(target=chatter, daemon=True)
    feeder.start()
    try:
        took, error = _elapsed(lambda: alice.wait(run_id, timeout=2))
    finally:
        stop.set()
        feeder.join(10)
    assert isinstance(error, TimeoutError), error
    assert 2 <= took < 2 + LATE, took  # not when the run ends, nor when the events pause
    executor.append(run_id, [("run.completed", {})])
    assert alice.wait(run_id, timeout=30)["status"] == "succeeded"


def test_wait_times_out_on_time_on_a_run_that_only_gets_keep_alives(alice):
    session = alice.create_session("echo")
    run_id = alice.send_message(session["id"], "nobody executes this")["run_id"]
    # keep-alives come at 3 s and 6 s: the deadline falls in the silence between them
    timeout = KEEPALIVE * 1.5
    took, error = _elapsed(lambda: alice.wait(run_id, timeout=timeout))
    assert isinstance(error, TimeoutError), error
    assert timeout <= took < timeout + LATE, took
    # shorter than the first keep-alive
    took, error = _elapsed(lambda: alice.wait(run_id, timeout=1))
    assert isinstance(error, TimeoutError) and 1 <= took < 1 + LATE, (took, error)
    alice.cancel(run_id)


# ---- streams outlive a restart --------------------------------------------------------------


def test_stream_and_wait_resume_across_a_killed_and_restarted_server(server, alice, executor):
    run_id = started_run(alice, executor)
    executor.append(run_id, [("message.delta", {"text": "before "})])
    with LedgerClient(server["server"].url, server["tokens"]["alice"]) as watcher:
        reader = Reader.stream(watcher, run_id)
        waiter = Reader(lambda _seen: watcher.wait(run_id, timeout=120))
        wait_until(lambda: reader.saw("message.delta"), timeout=30)
        time.sleep(0.5)  # the wait is streaming too by now
        # longer than the shared retry policy's whole budget (5 attempts, 1.5-3 s)
        down = server["server"].crash_and_restart(down=3)
        assert down > 3
        # a new client: the old one's pooled connections died with the server
        with ExecutorClient(server["server"].url, server["tokens"]["executor"],
                            executor.instance_id) as again:
            again.append(run_id, [("message.delta", {"text": "after"}), ("run.completed", {})])
        reader.join()
        waiter.join()
    assert reader.error is None and waiter.error is None, (reader.error, waiter.error)
    assert_the_stored_stream(alice, run_id, reader.events)
    assert [e["data"]["text"] for e in reader.events if e["type"] == "message.delta"] == [
        "before ", "after"]
    assert waiter.result["status"] == "succeeded"


class OutageProxy(FaultProxy):
    """A ``FaultProxy`` that plays an unreachable server: after ``outage()`` every open
    connection is dropped and each new one closed at once, until ``recover()``. ``attempts``
    holds when each connection came during an outage."""

    def __init__(self, upstream_port: int):
        super().__init__(upstream_port)
        self.down = False
        self.attempts: list[float] = []

    def _handle(self, client, number: int) -> None:
        if self.down:
            self.attempts.append(time.monotonic())
            _close(client)
            return
        super()._handle(client, number)

    def outage(self) -> None:
        self.down = True
        with self._lock:
            open_sockets, self._sockets = self._sockets, []
        for sock in open_sockets:
            _close(sock)

    def recover(self) -> None:
        self.down = False


def test_a_stream_reconnects_as_the_server_asks_until_it_is_back(server, alice, executor):
    run_id = started_run(alice, executor)
    executor.append(run_id, [("message.delta", {"text": "one "})])
    with OutageProxy(server["server"].port) as proxy, \
            LedgerClient(proxy.base_url, server["tokens"]["alice"]) as flaky:
        reader = Reader.stream(flaky, run_id)
        wait_until(lambda: reader.saw("message.delta"), timeout=30)
        proxy.outage()
        time.sleep(6)
        executor.append(run_id, [("message.delta", {"text": "two "})])  # missed live
        proxy.recover()
        wait_until(lambda: len(reader.events) == 4, timeout=30)
        executor.append(run_id, [("message.delta", {"text": "three"}), ("run.completed", {})])
        reader.join()
    assert reader.error is None, reader.error
    assert_the_stored_stream(alice, run_id, reader.events)
    assert [e["data"]["text"] for e in reader.events if e["type"] == "message.delta"] == [
        "one ", "two ", "three"]
    # at once after the drop, then no sooner than the server's retry hint each time
    gaps = [b - a for a, b in zip(proxy.attempts, proxy.attempts[1:], strict=False)]
    assert 2 <= len(proxy.attempts) <= 4, proxy.attempts
    assert all(gap >= RETRY_HINT * 0.99 for gap in gaps), gaps


def test_a_stream_gives_up_after_its_reconnect_time_and_wait_keeps_its_timeout(
        server, alice, executor):
    run_id = started_run(alice, executor)
    with OutageProxy(server["server"].port) as proxy:
        with LedgerClient(proxy.base_url, server["tokens"]["alice"],
                          stream_reconnect_seconds=5) as brief:
            reader = Reader.stream(brief, run_id)
            wait_until(lambda: reader.saw("run.started"), timeout=30)
            outage = time.monotonic()  # before the drop: the client counts from the drop on
            proxy.outage()
            reader.join()
            gave_up = reader.ended_at - outage
        assert isinstance(reader.error, ConnectionFailed), reader.error
        assert "no working connection for 5 s" in str(reader.error)
        assert 5 <= gave_up < 5 + LATE, gave_up
        proxy.recover()

        # ``wait``'s timeout comes first: 3 s, though the stream would try for 60 s
        with LedgerClient(proxy.base_url, server["tokens"]["alice"]) as patient:
            waiter = Reader(lambda _seen: patient.wait(run_id, timeout=3))
            time.sleep(1)  # streaming by now
            proxy.outage()
            waiter.join()
        assert isinstance(waiter.error, TimeoutError), waiter.error
        assert 3 <= waiter.ended_after < 3 + LATE, waiter.ended_after
        # down from the start: the first read keeps the deadline too
        with LedgerClient(proxy.base_url, server["tokens"]["alice"]) as late:
            took, error = _elapsed(lambda: late.wait(run_id, timeout=2))
        assert isinstance(error, TimeoutError) and 2 <= took < 2 + LATE, (took, error)
    executor.append(run_id, [("run.completed", {})])
