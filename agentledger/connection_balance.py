"""New connections go to the server's worker process that holds the fewest.

gunicorn's workers share one listening socket, and whichever worker's loop wakes first accepts
a new connection; a keep-alive connection then stays with that worker for its whole life. A few
long-lived clients (a reverse proxy's upstream pool, an SDK's connection pool, a load test) thus
often all land on one worker while the others sit idle: with 2 workers and 4 keep-alive clients
opened one after another, all 8 tries split them 4/0 or 3/1, and the clients created 344-384
runs/s on a 4/0 split against 460-628 on a 3/1 one (one worker is one core's worth of Python).

So every worker publishes how many connections it holds in a small array shared by the fork
(``ConnectionCounts``), and a worker that holds more than another one leaves a pending
connection to the others for a moment before taking it itself: least-connections balancing,
as a load balancer in front would do. The wait is bounded (``YIELD_SECONDS``) so that a worker
that is busy, stuck or gone costs a new connection a few milliseconds, never its acceptance; a
worker that stops publishes nothing, and neither does a slot no worker holds.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import select
import socket
import time

# The slot of no live worker.
ABSENT = -1
# How long a busier worker leaves a pending connection to a less busy one. A less busy worker
# whose request threads hold the GIL gets it back within Python's switch interval (5 ms).
YIELD_SECONDS = 0.02
POLL_SECONDS = 0.0005


class ConnectionCounts:
    """Open connections per worker slot, in memory the master shares with the workers it forks."""

    def __init__(self, slots: int):
        self._counts = multiprocessing.RawArray(ctypes.c_int, max(1, slots))
        for slot in range(len(self._counts)):
            self._counts[slot] = ABSENT

    def publish(self, slot: int, count: int) -> None:
        if 0 <= slot < len(self._counts):
            self._counts[slot] = count

    def leave(self, slot: int) -> None:
        """The worker in ``slot`` accepts no more connections (stopping, or gone)."""
        self.publish(slot, ABSENT)

    def snapshot(self) -> list[int]:
        return list(self._counts)

    def another_holds_fewer(self, slot: int, count: int) -> bool:
        return any(ABSENT < held < count for other, held in enumerate(self._counts)
                   if other != slot)

    def leave_to_another(self, slot: int, count: int, listener: socket.socket,
                         limit: float = YIELD_SECONDS) -> bool:
        """Wait (at most ``limit`` seconds) while a worker with fewer connections than ``count``
        takes what is pending on ``listener``. True when nothing is left pending for this worker;
        False when it should accept (it is not the busier one, or the others did not come)."""
        deadline = time.monotonic() + limit
        while self.another_holds_fewer(slot, count):
            # The listening socket stays readable while a connection waits to be accepted.
            pending, _, _ = select.select([listener], [], [], 0)
            if not pending:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)
        return False
