"""core.socket_deadlines: a wait on a socket whose peer stopped answering ends at its deadline,
and only work still armed is ever cut."""

from __future__ import annotations

import socket
import threading
import time

from agentledger.core.socket_deadlines import SocketDeadline


def _wait_for_answer(sock: socket.socket, into: list) -> None:
    started = time.monotonic()
    into.append(sock.recv(1))  # the peer never writes: only a shutdown ends this
    into.append(time.monotonic() - started)


def test_a_wait_still_armed_at_its_deadline_ends_then():
    ours, peer = socket.socketpair()
    with ours, peer:
        deadline = SocketDeadline(0.3, "test-deadline")
        key = deadline.arm(ours.fileno())
        got: list = []
        waiter = threading.Thread(target=_wait_for_answer, args=(ours, got))
        waiter.start()
        waiter.join(5)
        assert not waiter.is_alive(), "the wait did not end at its deadline"
        assert got[0] == b"" and 0.25 <= got[1] < 3, got  # end of stream, at the deadline
        assert deadline.disarm(key) is True


def test_work_disarmed_in_time_keeps_its_socket_and_later_deadlines_still_fire():
    first, first_peer = socket.socketpair()
    second, second_peer = socket.socketpair()
    with first, first_peer, second, second_peer:
        deadline = SocketDeadline(0.3, "test-deadline")
        for _ in range(1000):  # many short pieces of work, each done in time
            assert deadline.disarm(deadline.arm(first.fileno())) is False
        key = deadline.arm(second.fileno())
        got: list = []
        waiter = threading.Thread(target=_wait_for_answer, args=(second, got))
        waiter.start()
        waiter.join(5)
        assert got and got[0] == b"", "the armed wait was not ended"
        assert deadline.disarm(key) is True
        time.sleep(0.5)  # past every earlier deadline: none of them touched the first socket
        first_peer.sendall(b"x")
        assert first.recv(1) == b"x"
        first.sendall(b"y")
        assert first_peer.recv(1) == b"y"
