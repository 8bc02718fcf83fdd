"""An ASGI app under a real uvicorn on a loopback port, in the test's own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any

import uvicorn


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # Ctrl-C stays pytest's


@contextlib.asynccontextmanager
async def serve(app: Any, port: int = 0, *, tls_to: Callable[[ssl.SSLContext], Any] | None = None,
                **config: Any) -> AsyncIterator[int]:  # fmt: skip
    """Serve `app` (lifespan off: the caller starts it) on `port` (0: a free one); yields
    the port. `config`: more uvicorn settings (ssl_certfile, ssl_keyfile); `tls_to` is
    given the TLS context uvicorn made from them."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    server = _QuietServer(uvicorn.Config(
        app, lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=1,
        **config,
    ))  # fmt: skip
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    if tls_to is not None and server.config.ssl is not None:
        tls_to(server.config.ssl)
    try:
        yield port
    finally:
        server.should_exit = True
        await task
