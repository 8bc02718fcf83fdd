"""What a node and a gateway share to serve under uvicorn: the listening socket, and
signal handling that exits 0 after a graceful stop."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Generator

import uvicorn

from aenv.config import Config


class GracefulServer(uvicorn.Server):
    """uvicorn re-raises SIGINT/SIGTERM after a graceful stop; this one returns instead, so
    the process exits 0 (what a supervisor calls a clean stop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        original = {s: signal.signal(s, self.handle_exit) for s in sigs}
        try:
            yield
        finally:
            for s, h in original.items():
                signal.signal(s, h)


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


def tls_options(config: Config) -> dict[str, str]:
    """uvicorn's TLS settings for the configured certificate (none: plain HTTP)."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return {}
    return {"ssl_certfile": str(config.tls_cert_file), "ssl_keyfile": str(config.tls_key_file)}
