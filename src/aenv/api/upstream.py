"""The data-plane proxy's upstream side: a lean HTTP/1.1 client over asyncio streams with a
keep-alive pool per upstream address.

httpx + httpcore spend about a millisecond of CPU on each proxied request; this client does
only what the proxy needs (one request, one streamed response, connection reuse) for a small
fraction of that.

    pool = UpstreamPool()
    resp = await pool.request("GET", "10.0.0.2", 49983, b"/health", headers, body=None)
    async for chunk in resp.body():   # raw body bytes, de-chunked
        ...
    await resp.aclose()               # back to the pool if fully read and reusable

Framing follows RFC 9112: no body for HEAD, 1xx, 204 and 304; `Transfer-Encoding: chunked`
(de-chunked here; trailers dropped); `Content-Length`; else the body runs to EOF and the
connection is not reused. A request body (an async iterator of bytes) is sent with its
`Content-Length` when the caller gives one, else chunked, from its own task: the exchange is
full duplex, so the response head and body can come back while the request body is still
going up (Connect client streams, an upstream that answers an upload early). A connection
goes back to the pool only when both directions ended cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import time
from collections.abc import AsyncIterator

# TLS to an upstream: none, a sandbox's (True: whatever certificate it has), or a context
# that verifies (a cluster's links, cluster/links.py).
Tls = bool | ssl.SSLContext
Addr = tuple[str, int, Tls]  # host, port, TLS: one pool of connections each

CONNECT_TIMEOUT_S = 5.0
KEEPALIVE_EXPIRY_S = 30.0
MAX_IDLE_PER_ADDR = 64
MAX_HEAD_BYTES = 64 * 1024
READ_CHUNK = 64 * 1024
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_LIMIT = MAX_HEAD_BYTES + 1024  # StreamReader line limit: the whole response head fits


class UpstreamError(Exception):
    """The upstream broke the exchange (closed early, spoke bad HTTP)."""


class ConnectFailed(UpstreamError):
    """Nothing accepted a connection at the address in time."""


class _StaleConnection(Exception):
    """The connection failed before any byte of a response: a pooled one may just be stale."""


class _Conn:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        return (
            not self.reader.at_eof()
            and not self.writer.is_closing()
            and now - self.idle_since < KEEPALIVE_EXPIRY_S
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.transport.abort()


class UpstreamResponse:
    """Status and headers of an upstream response; the body is read with `body()`."""

    __slots__ = ("_conn", "_done", "_framing", "_length", "_pool", "_reusable", "_sender",
                 "addr", "headers", "status")  # fmt: skip

    def __init__(
        self, pool: UpstreamPool, addr: Addr, conn: _Conn, status: int,
        headers: list[tuple[bytes, bytes]], framing: str, length: int, reusable: bool,
        sender: asyncio.Task[None] | None = None,
    ) -> None:  # fmt: skip
        self._pool = pool
        self._sender = sender  # the request body still going up, if any
        self.addr = addr
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers  # as received, names in their original case
        self._framing = framing  # "none" | "length" | "chunked" | "eof"
        self._length = length
        self._reusable = reusable
        self._done = framing == "none" or (framing == "length" and length == 0)

    @property
    def has_length(self) -> bool:
        return self._framing in ("none", "length")

    async def body(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None or self._done:
            return
        r = conn.reader
        try:
            if self._framing == "length":
                left = self._length
                while left > 0:
                    chunk = await r.read(min(left, READ_CHUNK))
                    if not chunk:
                        raise UpstreamError("upstream closed before the end of the body")
                    left -= len(chunk)
                    yield chunk
            elif self._framing == "chunked":
                while True:
                    line = await r.readline()
                    if not line.endswith(b"\n"):
                        raise UpstreamError("upstream closed inside a chunked body")
                    size_s = line.split(b";", 1)[0].strip()
                    # Hex digits only (int() would take "-5", "0x5", "1_0"); 16 of them at most.
                    if not 0 < len(size_s) <= 16 or size_s.strip(_HEX_DIGITS):
                        raise UpstreamError(f"bad chunk size {size_s[:20]!r}")
                    size = int(size_s, 16)
                    if size == 0:
                        while True:  # trailers, dropped
                            t = await r.readline()
                            if not t.endswith(b"\n"):
                                raise UpstreamError("upstream closed inside trailers")
                            if t in (b"\r\n", b"\n"):
                                break
                        break
                    while size > 0:
                        chunk = await r.read(min(size, READ_CHUNK))
                        if not chunk:
                            raise UpstreamError("upstream closed inside a chunk")
                        size -= len(chunk)
                        yield chunk
                    if await r.readline() not in (b"\r\n", b"\n"):
                        raise UpstreamError("missing CRLF after a chunk")
            else:  # to EOF
                while chunk := await r.read(READ_CHUNK):
                    yield chunk
                self._reusable = False
            self._done = True
        except (ConnectionError, asyncio.LimitOverrunError, ValueError, UpstreamError) as e:
            # A request body that failed (e.g. the client went away) closed the connection
            # under us: that is the cause to report, not the broken read.
            failed = _body_failure(self._sender)
            if failed is not None:
                raise failed from None
            if isinstance(e, UpstreamError):
                raise
            raise UpstreamError(repr(e)) from None

    async def aclose(self) -> None:
        """Release the connection: pooled if the body was read to its end, else closed."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        sent = self._sender is None or (self._sender.done() and not self._sender.cancelled()
                                        and self._sender.exception() is None)  # fmt: skip
        if self._sender is not None and not self._sender.done():
            self._sender.cancel()  # the response ended first: the rest of the body is moot
        if self._done and self._reusable and sent:
            self._pool._release(self.addr, conn)
        else:
            conn.close()


async def _send_body(
    conn: _Conn, head: bytes | bytearray, body: AsyncIterator[bytes], chunked: bool
) -> None:
    w = conn.writer
    w.write(head)
    async for chunk in body:
        if not chunk:
            continue
        if chunked:
            w.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        else:
            w.write(chunk)
        await w.drain()  # backpressure: never more than the transport's buffer in flight
    if chunked:
        w.write(b"0\r\n\r\n")
    await w.drain()


def _on_body_sent(task: asyncio.Task[None], conn: _Conn) -> None:
    # A body that could not be read to its end leaves a request the upstream would wait on
    # forever: close the connection so the response side wakes up (and reports the cause).
    if _body_failure(task) is not None:
        conn.close()


def _body_failure(task: asyncio.Task[None] | None) -> BaseException | None:
    """The request body's own failure (not the upstream closing on it), if it had one."""
    if task is None or not task.done() or task.cancelled():
        return None
    exc = task.exception()  # also marks it retrieved
    return None if exc is None or isinstance(exc, ConnectionError) else exc


def tls_context(tls: Tls) -> ssl.SSLContext | None:
    if isinstance(tls, ssl.SSLContext):
        return tls
    return unchecked_tls() if tls else None


@functools.cache
def unchecked_tls() -> ssl.SSLContext:
    # A sandbox's HTTPS port serves whatever certificate it has (E2B: not verified).
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class UpstreamPool:
    def __init__(self) -> None:
        self._idle: dict[Addr, list[_Conn]] = {}
        self._closed = False

    async def request(
        self, method: str, host: str, port: int, target: bytes,
        headers: list[tuple[bytes, bytes]], body: AsyncIterator[bytes] | None = None,
        content_length: bytes | None = None, *, tls: Tls = False,
        host_header: bytes | None = None,
    ) -> UpstreamResponse:  # fmt: skip
        """Send a request and read the response head. `headers` must not hold hop-by-hop
        or framing headers; `Host` is set here (`host_header`, default host:port). `tls`:
        over TLS, True: the upstream's certificate unchecked (a sandbox's own). Raises
        ConnectFailed, UpstreamError, or whatever the body iterator raises."""
        addr = (host, port, tls)
        if host_header is None:
            host_header = b"%s:%d" % (host.encode(), port)
        head = bytearray(b"%s %s HTTP/1.1\r\nhost: %s\r\n"
                         % (method.encode(), target, host_header))  # fmt: skip
        for k, v in headers:
            head += k + b": " + v + b"\r\n"
        chunked = False
        if body is not None:
            if content_length is not None:
                head += b"content-length: " + content_length + b"\r\n"
            else:
                head += b"transfer-encoding: chunked\r\n"
                chunked = True
        head += b"\r\n"

        conn = self._acquire(addr)
        reused = conn is not None
        if conn is None:
            conn = await self._connect(addr)
        try:
            return await self._send(method, addr, conn, head, body, chunked)
        except _StaleConnection:
            if not (reused and body is None):
                raise UpstreamError("upstream closed the connection before answering") from None
        # A pooled connection the upstream had closed meanwhile: once more on a fresh one.
        conn = await self._connect(addr)
        try:
            return await self._send(method, addr, conn, head, None, False)
        except _StaleConnection:
            raise UpstreamError("upstream closed the connection before answering") from None

    async def _send(
        self, method: str, addr: Addr, conn: _Conn, head: bytes | bytearray,
        body: AsyncIterator[bytes] | None, chunked: bool,
    ) -> UpstreamResponse:  # fmt: skip
        try:
            if body is None:
                try:
                    conn.writer.write(head)
                    await conn.writer.drain()
                except ConnectionError:
                    raise _StaleConnection from None
                return await self._read_head(method, addr, conn)
            sender = asyncio.create_task(_send_body(conn, head, body, chunked))
            sender.add_done_callback(lambda t: _on_body_sent(t, conn))
            try:
                return await self._read_head(method, addr, conn, sender)
            except BaseException:
                sender.cancel()
                failed = _body_failure(sender)
                if failed is not None:
                    raise failed from None
                raise
        except BaseException:
            conn.close()
            raise

    async def _read_head(
        self, method: str, addr: Addr, conn: _Conn,
        sender: asyncio.Task[None] | None = None,
    ) -> UpstreamResponse:  # fmt: skip
        r = conn.reader
        while True:
            try:
                raw = await r.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as e:
                if not e.partial:
                    raise _StaleConnection from None
                raise UpstreamError("upstream closed inside the response head") from None
            except ConnectionError:
                raise _StaleConnection from None
            except asyncio.LimitOverrunError:
                raise UpstreamError("response head too large") from None
            lines = raw[:-4].split(b"\r\n")
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise UpstreamError(f"bad status line {lines[0][:60]!r}")
            try:
                status = int(parts[1])
            except ValueError:
                raise UpstreamError(f"bad status line {lines[0][:60]!r}") from None
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue and friends: the real answer follows
            break
        headers: list[tuple[bytes, bytes]] = []
        length = -1
        chunked = False
        close = parts[0] == b"HTTP/1.0"
        for line in lines[1:]:
            k, sep, v = line.partition(b":")
            if not sep:
                raise UpstreamError("bad header line")
            v = v.strip()
            lk = k.lower()
            if lk == b"content-length":
                # Digits only (int() would take "+5", " 5", "5_0"); two differing values
                # would make the body's end ambiguous.
                if not v.isdigit() or len(v) > 18 or length not in (-1, int(v)):
                    raise UpstreamError("bad Content-Length")
                length = int(v)
            elif lk == b"transfer-encoding":
                chunked = v.lower().endswith(b"chunked")
            elif lk == b"connection":
                tokens = {t.strip().lower() for t in v.split(b",")}
                if b"close" in tokens:
                    close = True
                elif b"keep-alive" in tokens:
                    close = False
            headers.append((k, v))
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            framing = "none"
        elif chunked:
            framing = "chunked"
        elif length >= 0:
            framing = "length"
        else:
            framing, close = "eof", True
        return UpstreamResponse(self, addr, conn, status, headers, framing, length, not close,
                                sender)  # fmt: skip

    def _acquire(self, addr: Addr) -> _Conn | None:
        idle = self._idle.get(addr)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        return None

    def _release(self, addr: Addr, conn: _Conn) -> None:
        idle = self._idle.setdefault(addr, [])
        if self._closed or len(idle) >= MAX_IDLE_PER_ADDR or conn.reader.at_eof():
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def _connect(self, addr: Addr) -> _Conn:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(
                    addr[0], addr[1], limit=_LIMIT, ssl=tls_context(addr[2]))
        except (OSError, TimeoutError) as e:
            raise ConnectFailed(repr(e)) from None
        return _Conn(reader, writer)

    def forget_host(self, host: str) -> None:
        """Close idle connections to `host` (any port): its address is about to be reused."""
        for addr in [a for a in self._idle if a[0] == host]:
            for conn in self._idle.pop(addr):
                conn.close()

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    def idle_count(self, host: str | None = None) -> int:
        return sum(len(v) for a, v in self._idle.items() if host is None or a[0] == host)
