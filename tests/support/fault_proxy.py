"""``FaultProxy``: a tiny TCP proxy in front of a real server that breaks chosen connections.

Connections are numbered from 1 in the order they are accepted; ``faults`` maps a number to
what happens to that connection (the others pass through untouched):

- ``("drop_answer",)``: the request reaches the server, which handles it; its answer is
  swallowed and the connection closed (the client never learns what happened);
- ``("cut", n)``: the first ``n`` bytes of the server's answer pass, then the connection is
  closed (a dropped stream, possibly in the middle of a frame);
- ``("canned", raw_bytes)``: the server is never contacted; the client gets ``raw_bytes``
  (say a 503) and the connection is closed.
"""

from __future__ import annotations

import socket
import threading


class FaultProxy:
    def __init__(self, upstream_port: int, faults: dict[int, tuple] | None = None):
        self.upstream_port = upstream_port
        self.faults = dict(faults or {})
        self.connections = 0
        self.faulted: list[int] = []
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="fault-proxy").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                number = self.connections
                self._sockets.append(client)
            threading.Thread(target=self._handle, args=(client, number), daemon=True).start()

    def _handle(self, client: socket.socket, number: int) -> None:
        fault = self.faults.get(number)
        if fault is not None:
            self.faulted.append(number)
        if fault and fault[0] == "canned":
            try:
                client.recv(65536)  # the request (its head at least)
                client.sendall(fault[1])
            except OSError:
                pass
            _close(client)
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        except OSError:
            _close(client)
            return
        with self._lock:
            self._sockets.append(upstream)
        threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
        self._pump(upstream, client, fault)

    def _pump(self, source: socket.socket, target: socket.socket, fault: tuple | None) -> None:
        budget = None if fault is None else (0 if fault[0] == "drop_answer" else fault[1])
        try:
            while True:
                chunk = source.recv(65536)
                if not chunk:
                    break
                if budget is not None:
                    if len(chunk) >= budget:
                        if budget:
                            target.sendall(chunk[:budget])
                        break
                    budget -= len(chunk)
                target.sendall(chunk)
        except OSError:
            pass
        _close(source)
        _close(target)

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        with self._lock:
            for sock in self._sockets:
                _close(sock)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def canned(status: int, reason: str, *, headers: dict[str, str] | None = None,
           body: bytes = b'{"error": {"code": "unavailable", "message": "try again"}}',
           content_type: str = "application/json") -> bytes:
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body
