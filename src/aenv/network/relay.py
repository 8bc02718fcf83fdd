"""Byte relays between two TCP sockets, for the egress proxy and the SOCKS tunnels.

Plain sockets are joined by splice(2) through a pipe per direction, driven by the loop's
readiness callbacks: the bytes never enter Python. A TLS session (to a SOCKS proxy) is
relayed through asyncio streams instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

PIPE_SIZE = 1 << 20  # per direction: what one splice moves at most
CHUNK = 1 << 16


async def accept(listener: socket.socket, what: str) -> tuple[socket.socket, str]:
    """The next connection and its peer's address. EMFILE and the like are logged and
    waited out: the listener itself stays."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            conn, peer = await loop.sock_accept(listener)
            return conn, peer[0]
        except OSError as e:
            log.warning("%s: accept: %s", what, e)
            await asyncio.sleep(0.1)


def reset(sock: socket.socket) -> None:
    """Close with RST, not FIN: a refused guest must not take it for an answer."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@dataclass
class Tunnel:
    """The far side of a relay: a plain socket (joined by splice), or the streams of a TLS
    session (to a SOCKS proxy)."""

    sock: socket.socket | None = None
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    def close(self, rst: bool = False) -> None:
        if self.sock is not None:
            reset(self.sock) if rst else self.sock.close()
        elif self.writer is not None:
            self.writer.transport.abort()


async def relay_tunnel(conn: socket.socket, up: Tunnel, head: bytes = b"") -> None:
    """`head` (bytes already read from `conn`) to `up`, then both ways until both ended.
    Closes both: a cancel (a policy closed it) or an error resets them."""
    try:
        if up.sock is not None:
            await asyncio.get_running_loop().sock_sendall(up.sock, head)
            await relay(conn, up.sock)
        else:
            await _relay_streams(conn, up, head)
    except (asyncio.CancelledError, OSError):
        up.close(rst=True)
        reset(conn)
        return
    up.close()
    conn.close()


async def _relay_streams(conn: socket.socket, up: Tunnel, head: bytes) -> None:
    """A TLS tunnel: its half-close cannot be passed on (TLS has none but close_notify,
    which many proxies take for a full close), so the guest's EOF is kept and the tunnel
    ends when the proxy's side does."""
    assert up.reader is not None and up.writer is not None
    reader, writer = await asyncio.open_connection(sock=conn)
    uw, ur = up.writer, up.reader

    async def out() -> None:
        if head:
            uw.write(head)
        while data := await reader.read(CHUNK):
            uw.write(data)
            await uw.drain()

    async def back() -> None:
        while data := await ur.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    tasks = [asyncio.ensure_future(out()), asyncio.ensure_future(back())]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        # The transport owns `conn` now: the reset goes through it.
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        raise
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def relay(a: socket.socket, b: socket.socket) -> None:
    """Both directions until both ended; the first error ends the other too."""
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    ended = 0

    def on_end(err: OSError | None) -> None:
        nonlocal ended
        if done.done():
            return
        if err is not None:
            done.set_exception(err)
            return
        ended += 1
        if ended == 2:
            done.set_result(None)

    pumps = [_Pump(loop, a, b, on_end), _Pump(loop, b, a, on_end)]
    try:
        await done
    finally:
        for p in pumps:
            p.stop()


_F_SETPIPE_SZ = 1031
_SPLICE = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class _Pump:
    """src -> dst through a pipe with splice(2), driven by the loop's readiness callbacks
    (no task, no future per wake: the hop adds as little latency as it can). The bytes
    never enter this process; the proxy never reads past the name anyway. At EOF the
    half-close is passed on; `on_end` hears of the EOF (None) or the error."""

    def __init__(self, loop: asyncio.AbstractEventLoop, src: socket.socket,
                 dst: socket.socket, on_end: Callable[[OSError | None], None]) -> None:  # fmt: skip
        self.loop, self.src, self.dst, self.on_end = loop, src.fileno(), dst.fileno(), on_end
        self.dst_sock = dst
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.w, _F_SETPIPE_SZ, PIPE_SIZE)
        self.queued = 0  # bytes in the pipe not yet written to dst
        self.waiting: str | None = None
        self._watch_src()

    def _watch_src(self) -> None:
        self.waiting = "src"
        self.loop.add_reader(self.src, self._run)

    def _watch_dst(self) -> None:
        self.waiting = "dst"
        self.loop.add_writer(self.dst, self._run)

    def _unwatch(self) -> None:
        if self.waiting == "src":
            self.loop.remove_reader(self.src)
        elif self.waiting == "dst":
            self.loop.remove_writer(self.dst)
        self.waiting = None

    def _run(self) -> None:
        try:
            while True:
                while self.queued:
                    try:
                        self.queued -= os.splice(self.r, self.dst, self.queued, flags=_SPLICE)
                    except BlockingIOError:
                        if self.waiting != "dst":
                            self._unwatch()
                            self._watch_dst()
                        return
                try:
                    n = os.splice(self.src, self.w, PIPE_SIZE, flags=_SPLICE)
                except BlockingIOError:
                    if self.waiting != "src":
                        self._unwatch()
                        self._watch_src()
                    return
                if n == 0:
                    self._unwatch()
                    with contextlib.suppress(OSError):
                        self.dst_sock.shutdown(socket.SHUT_WR)
                    self.on_end(None)
                    return
                self.queued = n
        except OSError as e:
            self._unwatch()
            self.on_end(e)

    def stop(self) -> None:
        self._unwatch()
        for fd in (self.r, self.w):
            with contextlib.suppress(OSError):
                os.close(fd)
