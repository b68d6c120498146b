"""Deadlines for waits on a database server that stopped answering without going away.

A server that hangs (a frozen host, a network partition, a stopped process) leaves libpq
waiting for its answer forever: the server's own ``statement_timeout`` cannot fire, and TCP
sees nothing wrong while the peer's kernel still acknowledges. ``connect_timeout`` bounds only
the connecting. A ``SocketDeadline`` ends such a wait: work on a connection is armed with the
connection's socket, and when it is still armed after ``seconds`` a thread shuts the socket
down; the wait then ends at once with the driver's "server closed the connection" error, which
callers already treat as a server that cannot be reached.

Every deadline of one ``SocketDeadline`` is the same length, so they expire in the order they
were armed: arming and disarming are dictionary operations, and the thread only ever looks at
the oldest.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections import OrderedDict


class SocketDeadline:
    """Shuts down the socket of work still armed ``seconds`` after it was armed."""

    def __init__(self, seconds: float, name: str):
        self.seconds = seconds
        self._name = name
        self._cond = threading.Condition()
        self._armed: OrderedDict[int, tuple[float, int]] = OrderedDict()  # key: (deadline, fd)
        self._cut: set[int] = set()
        self._keys = itertools.count(1)
        self._thread_pid: int | None = None

    def arm(self, fd: int) -> int:
        """Start the deadline of work on the socket ``fd``; ``disarm`` it with the key returned
        as soon as the work ends (a socket is only ever shut down while its work is armed)."""
        with self._cond:
            key = next(self._keys)
            self._armed[key] = (time.monotonic() + self.seconds, fd)
            if self._thread_pid != os.getpid():  # none yet, or a forked child's copy of none
                self._thread_pid = os.getpid()
                threading.Thread(target=self._run, name=self._name, daemon=True).start()
            elif len(self._armed) == 1:
                self._cond.notify()
        return key

    def disarm(self, key: int) -> bool:
        """End the work's deadline: True when it had passed and its socket was shut down."""
        with self._cond:
            self._armed.pop(key, None)
            if key in self._cut:
                self._cut.discard(key)
                return True
            return False

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._armed:
                    self._cond.wait()
                    continue
                key, (deadline, fd) = next(iter(self._armed.items()))
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                # Under the lock: the work cannot be disarmed (and its connection closed, its
                # descriptor reused) while its socket is shut down.
                del self._armed[key]
                self._cut.add(key)
                _shut_down(fd)


def _shut_down(fd: int) -> None:
    try:
        duplicate = socket.socket(fileno=os.dup(fd))
    except OSError:
        return  # already closed
    try:
        duplicate.shutdown(socket.SHUT_RDWR)  # acts on the connection, not on one descriptor
    except OSError:
        pass
    finally:
        duplicate.close()
