"""The proxy's lean HTTP/1.1 upstream client against scripted raw-socket servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from aenv.api.upstream import ConnectFailed, UpstreamError, UpstreamPool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _server(handler: Handler) -> tuple[asyncio.Server, int, list[bytes]]:
    """A server whose handler gets each connection; `heads` collects request heads."""
    heads: list[bytes] = []

    async def conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await handler(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    async def wrapped(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        orig = r.readuntil

        async def spy(sep: bytes = b"\n") -> bytes:
            data = await orig(sep)
            if sep == b"\r\n\r\n":
                heads.append(data)
            return data

        r.readuntil = spy  # type: ignore[method-assign]
        await conn(r, w)

    srv = await asyncio.start_server(wrapped, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1], heads


async def _read(resp) -> bytes:  # type: ignore[no-untyped-def]
    out = b""
    async for chunk in resp.body():
        out += chunk
    await resp.aclose()
    return out


def _keepalive(reply: bytes) -> Handler:
    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await r.readuntil(b"\r\n\r\n")
            w.write(reply)
            await w.drain()

    return h


async def test_content_length_and_reuse() -> None:
    srv, port, heads = await _server(
        _keepalive(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello"))
    pool = UpstreamPool()
    async with srv:
        for _ in range(3):
            resp = await pool.request("GET", "127.0.0.1", port, b"/x?q=1", [(b"x-h", b"v")])
            assert resp.status == 200 and resp.has_length
            assert (b"X-A", b"b") in resp.headers
            assert await _read(resp) == b"hello"
        assert pool.idle_count() == 1  # one connection, reused
        assert heads[0].startswith(b"GET /x?q=1 HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % port)
        assert b"x-h: v\r\n" in heads[0]
        pool.forget_host("127.0.0.1")
        assert pool.idle_count() == 0
        await pool.aclose()


async def test_chunked_response_is_dechunked_and_trailers_dropped() -> None:
    reply = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
             b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n")  # fmt: skip
    srv, port, _ = await _server(_keepalive(reply))
    pool = UpstreamPool()
    async with srv:
        resp = await pool.request("GET", "127.0.0.1", port, b"/", [])
        assert not resp.has_length
        assert await _read(resp) == b"abcde"
        assert pool.idle_count() == 1
        await pool.aclose()


async def test_body_to_eof_is_not_reused() -> None:
    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\n\r\nstream until close")
        await w.drain()

    srv, port, _ = await _server(h)
    pool = UpstreamPool()
    async with srv:
        resp = await pool.request("GET", "127.0.0.1", port, b"/", [])
        assert await _read(resp) == b"stream until close"
        assert pool.idle_count() == 0
        await pool.aclose()


@pytest.mark.parametrize(("method", "status"), [("HEAD", 200), ("GET", 204), ("GET", 304)])
async def test_no_body_responses(method: str, status: int) -> None:
    srv, port, _ = await _server(
        _keepalive(b"HTTP/1.1 %d X\r\nContent-Length: 10\r\n\r\n" % status))
    pool = UpstreamPool()
    async with srv:
        resp = await pool.request(method, "127.0.0.1", port, b"/", [])
        assert resp.status == status
        assert await _read(resp) == b""
        assert pool.idle_count() == 1
        await pool.aclose()


async def test_100_continue_is_skipped_and_connection_close_honoured() -> None:
    srv, port, _ = await _server(_keepalive(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nConnection: close\r\n"
        b"Content-Length: 2\r\n\r\nok"))  # fmt: skip
    pool = UpstreamPool()
    async with srv:
        resp = await pool.request("POST", "127.0.0.1", port, b"/", [])
        assert resp.status == 201
        assert await _read(resp) == b"ok"
        assert pool.idle_count() == 0
        await pool.aclose()


async def _gen(*chunks: bytes) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


async def test_request_bodies_length_and_chunked() -> None:
    got: list[bytes] = []

    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            if b"content-length: 6" in head:
                got.append(await r.readexactly(6))
            else:
                assert b"transfer-encoding: chunked" in head
                body = b""
                while True:
                    size = int((await r.readline()).strip(), 16)
                    data = await r.readexactly(size + 2)
                    if size == 0:
                        break
                    body += data[:-2]
                got.append(body)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await w.drain()

    srv, port, _ = await _server(h)
    pool = UpstreamPool()
    async with srv:
        r1 = await pool.request("POST", "127.0.0.1", port, b"/", [], _gen(b"abc", b"def"), b"6")
        await _read(r1)
        r2 = await pool.request("POST", "127.0.0.1", port, b"/", [], _gen(b"x", b"", b"yz"))
        await _read(r2)
        assert got == [b"abcdef", b"xyz"]
        await pool.aclose()


async def test_stale_pooled_connection_is_retried_once() -> None:
    count = 0

    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n%d" % count)
        await w.drain()
        await r.readuntil(b"\r\n\r\n")  # the next request: close without answering

    srv, port, _ = await _server(h)
    pool = UpstreamPool()
    async with srv:
        assert await _read(await pool.request("GET", "127.0.0.1", port, b"/", [])) == b"1"
        assert await _read(await pool.request("GET", "127.0.0.1", port, b"/", [])) == b"2"
        await pool.aclose()


async def test_errors() -> None:
    pool = UpstreamPool()
    srv, port, _ = await _server(lambda r, w: asyncio.sleep(0))
    srv.close()
    await srv.wait_closed()
    with pytest.raises(ConnectFailed):
        await pool.request("GET", "127.0.0.1", port, b"/", [])

    async def short(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await w.drain()

    srv, port, _ = await _server(short)
    async with srv:
        resp = await pool.request("GET", "127.0.0.1", port, b"/", [])
        with pytest.raises(UpstreamError):
            await _read(resp)
        await resp.aclose()
        assert pool.idle_count() == 0

    srv, port, _ = await _server(_keepalive(b"garbage\r\n\r\n"))
    async with srv:
        with pytest.raises(UpstreamError):
            await pool.request("GET", "127.0.0.1", port, b"/", [])
    await pool.aclose()


def _chunked_echo() -> Handler:
    """Answers at once, then echoes each request chunk as a response chunk as it arrives."""

    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            await w.drain()
            while True:
                size = int((await r.readline()).strip(), 16)
                data = await r.readexactly(size + 2)
                w.write(b"%x\r\n%s" % (size, data))
                if size == 0:
                    w.write(b"\r\n")
                await w.drain()
                if size == 0:
                    break

    return h


async def test_request_body_and_response_stream_at_the_same_time() -> None:
    srv, port, _ = await _server(_chunked_echo())
    pool = UpstreamPool()
    echoed = asyncio.Queue[bytes]()

    async def body() -> AsyncIterator[bytes]:
        for word in (b"one", b"two", b"three"):
            yield word
            # The next chunk goes up only after this one came back down: a client that
            # sent its whole body before reading the response would wait here forever.
            assert await echoed.get() == word

    async with srv, asyncio.timeout(10):
        resp = await pool.request("POST", "127.0.0.1", port, b"/", [], body())
        assert resp.status == 200
        got = b""
        async for chunk in resp.body():
            got += chunk
            await echoed.put(chunk)
        await resp.aclose()
        assert got == b"onetwothree"
        assert pool.idle_count() == 1  # both directions ended cleanly: reusable
        await pool.aclose()


async def test_a_failing_request_body_ends_the_response_with_its_error() -> None:
    srv, port, _ = await _server(_chunked_echo())
    pool = UpstreamPool()
    go_on = asyncio.Event()

    class ClientGone(Exception):
        pass

    async def body() -> AsyncIterator[bytes]:
        yield b"first"
        await go_on.wait()
        raise ClientGone

    async with srv, asyncio.timeout(10):
        resp = await pool.request("POST", "127.0.0.1", port, b"/", [], body())
        it = resp.body()
        assert await anext(it) == b"first"
        go_on.set()
        with pytest.raises(ClientGone):
            await anext(it)
        await resp.aclose()
        assert pool.idle_count() == 0
        # before the response head: request() raises it
        go_on.set()

        async def early() -> AsyncIterator[bytes]:
            raise ClientGone
            yield b""

        srv2, port2, _ = await _server(lambda r, w: r.readuntil(b"never"))
        async with srv2:
            with pytest.raises(ClientGone):
                await pool.request("POST", "127.0.0.1", port2, b"/", [], early())
        await pool.aclose()


async def test_a_response_that_ends_before_the_request_body_drops_the_connection() -> None:
    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 413 Too Large\r\nContent-Length: 3\r\n\r\nbig")
        await w.drain()
        await r.read()  # keeps reading: the connection stays up

    srv, port, _ = await _server(h)
    pool = UpstreamPool()
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        while True:
            sent += 1
            yield b"x" * 65536
            await asyncio.sleep(0.01)

    async with srv, asyncio.timeout(10):
        resp = await pool.request("POST", "127.0.0.1", port, b"/", [], body())
        assert resp.status == 413
        assert await _read(resp) == b"big"
        n = sent
        await asyncio.sleep(0.1)
        assert sent <= n + 1  # the rest of the body is no longer sent
        assert pool.idle_count() == 0  # half a request went up: not reusable
        await pool.aclose()
