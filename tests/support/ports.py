"""A free TCP port for servers the tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now at 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
