"""New connections go to the ``serve`` worker process that holds the fewest.

``ConnectionCounts`` is checked on a real listening socket, with a thread standing in for the
other worker; the server tests start ``agentledger serve --workers 2`` and read which worker
process holds each established connection from ``/proc`` (Linux), the way ``ss -tnp`` does.
Without the balancing, 4 keep-alive connections opened one after another landed 4/0 or 3/1 in
all 8 tries on this machine kind.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from support.waiting import wait_until

from agentledger.connection_balance import ABSENT, ConnectionCounts
from agentledger.server import ready_workers

# ---- the shared counts --------------------------------------------------------------------------


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    yield sock
    sock.close()


def _connect(listener: socket.socket) -> socket.socket:
    client = socket.create_connection(listener.getsockname())
    # The connection is pending on the listener once the handshake is done.
    wait_until(lambda: _pending(listener), timeout=5, message="the connection to be pending")
    return client


def _pending(listener: socket.socket) -> bool:
    import select

    return bool(select.select([listener], [], [], 0)[0])


def test_only_a_live_worker_with_fewer_connections_counts():
    counts = ConnectionCounts(3)
    assert counts.snapshot() == [ABSENT, ABSENT, ABSENT]
    assert not counts.another_holds_fewer(0, 5)  # no other worker has said anything
    counts.publish(1, 2)
    assert counts.another_holds_fewer(0, 3)
    assert not counts.another_holds_fewer(0, 2)  # as many: no reason to step aside
    assert not counts.another_holds_fewer(1, 9)  # its own slot is not another worker
    counts.leave(1)
    assert not counts.another_holds_fewer(0, 3)
    counts.publish(7, 0)  # a slot beyond the array is nobody's
    assert counts.snapshot() == [ABSENT, ABSENT, ABSENT]


def test_a_busier_worker_leaves_the_connection_to_a_less_busy_one(listener):
    counts = ConnectionCounts(2)
    counts.publish(0, 3)
    counts.publish(1, 1)
    client = _connect(listener)
    taken: list[socket.socket] = []

    def other_worker():
        time.sleep(0.005)
        while True:
            try:
                taken.append(listener.accept()[0])
                return
            except BlockingIOError:
                time.sleep(0.0005)

    thread = threading.Thread(target=other_worker)
    thread.start()
    try:
        assert counts.leave_to_another(0, 3, listener, limit=5.0) is True
        thread.join(5)
        assert len(taken) == 1
        assert not _pending(listener)
    finally:
        client.close()
        for sock in taken:
            sock.close()


def test_a_busier_worker_takes_the_connection_when_nobody_else_does(listener):
    counts = ConnectionCounts(2)
    counts.publish(0, 3)
    counts.publish(1, 0)
    client = _connect(listener)
    try:
        started = time.monotonic()
        assert counts.leave_to_another(0, 3, listener, limit=0.05) is False
        waited = time.monotonic() - started
        assert 0.05 <= waited < 1.0, waited
        assert _pending(listener)  # still there for this worker to accept
        listener.accept()[0].close()
    finally:
        client.close()


def test_a_worker_that_is_not_busier_does_not_wait(listener):
    counts = ConnectionCounts(2)
    counts.publish(0, 2)
    counts.publish(1, 2)
    client = _connect(listener)
    try:
        started = time.monotonic()
        assert counts.leave_to_another(0, 2, listener, limit=5.0) is False
        assert time.monotonic() - started < 1.0
    finally:
        client.close()


# ---- a real server --------------------------------------------------------------------------


def _worker_pids(master: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == master:
            pids.append(int(entry.name))
    return sorted(pids)


def _established_inodes(port: int) -> set[str]:
    """Socket inodes of the established TCP connections whose local port is ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def _connections_per_worker(master: int, port: int) -> dict[int, int]:
    established = _established_inodes(port)
    held = {}
    for pid in _worker_pids(master):
        count = 0
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = os.readlink(fd)
                except FileNotFoundError:
                    continue
                if target.startswith("socket:[") and target[8:-1] in established:
                    count += 1
        except FileNotFoundError:
            continue
        held[pid] = count
    return held


def _keep_alive(port: int) -> http.client.HTTPConnection:
    """A new keep-alive connection that has had one answer (so a worker has accepted it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/api/health")
    reply = conn.getresponse()
    reply.read()
    assert reply.status == 200
    return conn


def _ready(proc) -> int:
    return ready_workers(proc.log())


def _ready_workers(proc, count: int) -> None:
    wait_until(lambda: _ready(proc) >= count and
               len(_worker_pids(proc.pid)) == count, timeout=60,
               message=lambda: f"{count} ready HTTP workers:\n{proc.log()[-3000:]}")


def test_keep_alive_clients_are_spread_over_the_workers(db_url, procs):
    server = procs.serve(db_url, args=("--workers", "2", "--no-reconciler"))
    _ready_workers(server, 2)
    assert server.port is not None
    conns = []
    try:
        for _ in range(6):
            conns.append(_keep_alive(server.port))
        held = wait_until(lambda: (h := _connections_per_worker(server.pid, server.port))
                          and sum(h.values()) == 6 and h, timeout=10,
                          message="the 6 connections to be seen")
        assert sorted(held.values()) == [3, 3], held
    finally:
        for conn in conns:
            conn.close()


def test_a_replaced_worker_takes_the_next_connections(pg_url, procs):
    server = procs.serve(pg_url, args=("--workers", "2", "--no-reconciler"))
    _ready_workers(server, 2)
    assert server.port is not None
    conns = [_keep_alive(server.port) for _ in range(4)]
    try:
        held = wait_until(lambda: (h := _connections_per_worker(server.pid, server.port))
                          and sum(h.values()) == 4 and h, timeout=10,
                          message="the 4 connections to be seen")
        assert sorted(held.values()) == [2, 2], held
        killed = next(iter(held))
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: killed not in _worker_pids(server.pid)
                   and _ready(server) >= 3
                   and len(_worker_pids(server.pid)) == 2, timeout=60,
                   message=lambda: f"the killed worker to be replaced:\n{server.log()[-3000:]}")
        (replacement,) = set(_worker_pids(server.pid)) - set(held)
        # The survivor holds 2 connections, the replacement none: both new ones go to it.
        conns += [_keep_alive(server.port) for _ in range(2)]
        now = wait_until(lambda: (h := _connections_per_worker(server.pid, server.port))
                         and sum(h.values()) == 4 and h, timeout=10,
                         message="the survivor's 2 and the 2 new connections to be seen")
        assert now[replacement] == 2, now
    finally:
        for conn in conns:
            conn.close()
