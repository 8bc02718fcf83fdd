"""A TCP proxy on loopback that a test can cut and restore: how one process on a shared
loopback is cut off from a service (etcd) that the others still reach."""

from __future__ import annotations

import asyncio
import contextlib
import socket


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._serve, sock=sock)

    async def cut(self) -> None:
        """Refuse new connections and drop the open ones."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._open):
            w.transport.abort()
        self._open.clear()

    async def restore(self) -> None:
        await self.start()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open.update((writer, up_w))

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.transport.abort()

        await asyncio.gather(pump(reader, up_w), pump(up_r, writer))
        self._open.discard(writer)
        self._open.discard(up_w)
