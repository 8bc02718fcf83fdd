"""The node's listening socket: accepted connections must get TCP_NODELAY from asyncio."""

from __future__ import annotations

import asyncio
import socket

from aenv.api.serving import listen


async def test_accepted_connections_have_nodelay() -> None:
    sock = listen("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY only then
    got: list[int] = []

    async def conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        s = w.get_extra_info("socket")
        got.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        w.close()

    server = await asyncio.start_server(conn, sock=sock)
    async with server:
        _, w = await asyncio.open_connection(*sock.getsockname())
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.01)
        w.close()
    assert got and got[0] != 0
