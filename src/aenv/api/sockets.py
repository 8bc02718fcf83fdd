"""The listening socket of a node or a gateway."""

from __future__ import annotations

import socket


def listen(host: str, port: int) -> socket.socket:
    """Bind before anything starts, so a taken port is one clear error with nothing
    (no VM, no slot) to undo."""
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP
    # (a proto of 0 leaves Nagle on: +40 ms on every keep-alive response).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM, socket.IPPROTO_TCP)  # fmt: skip
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
