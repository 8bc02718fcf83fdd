"""What a node and a gateway share to serve under uvicorn: the listening socket, signal
handling that exits 0 after a graceful stop, and side listeners (a node's cluster listener,
the web console) started and stopped with the main one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Generator

import uvicorn

from aenv.config import Config
from aenv.console.app import console_app
from aenv.origins import api_origin, console_port

log = logging.getLogger("aenv.server")
Side = tuple[uvicorn.Config, socket.socket]


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


class SideServer(uvicorn.Server):
    """A side listener: no lifespan or signals of its own; its main server holds them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class ServerWithSides(GracefulServer):
    """Starts `sides` once it serves (and others by `start_side`); stops them first."""

    def __init__(self, config: uvicorn.Config, sides: list[Side] | None = None) -> None:
        super().__init__(config)
        self._pending = sides or []
        self._sides: list[tuple[SideServer, asyncio.Task[None]]] = []

    async def startup(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        await super().startup(sockets)
        if not self.should_exit:
            for side in self._pending:
                self.start_side(*side)

    def start_side(self, config: uvicorn.Config, sock: socket.socket) -> None:
        server = SideServer(config)
        self._sides.append((server, asyncio.create_task(server.serve([sock]))))

    async def shutdown(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        for server, _ in self._sides:
            server.should_exit = True
        for _, task in self._sides:
            await task
        await super().shutdown(sockets)


def console_side(config: Config, port: int) -> Side | None:
    """The web console beside an API on `port` (docs/console.md): its own port, over TLS when
    the API is. A port that cannot be bound costs the console only (logged)."""
    if not config.console:
        return None
    cport = console_port(config, port)
    try:
        sock = listen(config.host, cport)
    except OSError as e:
        log.warning("the console is off: cannot listen on %s:%d (console_port): %s",
                    config.host, cport, e.strerror)  # fmt: skip
        return None
    return uvicorn.Config(
        console_app(api_origin(config, port)), host=config.host, port=cport, lifespan="off",
        access_log=False, log_config=None, server_header=False,
        **tls_options(config),  # type: ignore[arg-type]
    ), sock  # fmt: skip


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
