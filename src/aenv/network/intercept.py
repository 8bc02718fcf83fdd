"""TLS interception and HTTP/1 request rewriting for `network.rules` (transforms.py).

Only a connection whose name (SNI or Host) matches one of its sandbox's rules comes here.
Over TLS the proxy answers with a certificate of the node's CA for that name
(interception_ca.py), which the guest trusts while its policy has rules, and connects on
with TLS of its own, verifying the real server. Every request on the connection
(keep-alive included) gets the rule's headers, placeholders resolved to secret values at
that moment; anything else passes unchanged. A secret that is gone answers 502: the request
never leaves without it. HTTP/2 is not offered (ALPN http/1.1), and an upgraded connection
(101: WebSocket) is relayed as bytes after its first request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h11

from aenv.network.interception_ca import InterceptionCA
from aenv.network.relay import CHUNK, Tunnel
from aenv.network.transforms import Rule, resolve

SecretLookup = Callable[[str, str], Awaitable[str]]  # (team, name) -> value
log = logging.getLogger(__name__)


@dataclass
class Interceptor:
    # Made or read on first use: its files live in the data directory, which exists only
    # once the runtime has mounted it (a fresh host's first start).
    load_ca: Callable[[], InterceptionCA]
    upstream_tls: ssl.SSLContext
    secret: SecretLookup | None = None  # the orchestrator's SecretStore.value
    _ca: InterceptionCA | None = field(default=None, repr=False)

    @property
    def ca(self) -> InterceptionCA:
        if self._ca is None:
            self._ca = self.load_ca()
        return self._ca

    @ca.setter
    def ca(self, ca: InterceptionCA) -> None:
        self._ca = ca


class _Refused(Exception):
    pass


async def guest_streams(conn: socket.socket, tls: ssl.SSLContext | None
                        ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:  # fmt: skip
    """Streams over the guest's accepted socket, as a TLS server with `tls`."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=conn, ssl=tls)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def intercept(guest: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                    up: Tunnel, name: str, tls: bool, rule: Rule, ic: Interceptor,
                    upstream_tls: ssl.SSLContext | None = None) -> None:  # fmt: skip
    """Serve the guest's connection (its streams, TLS ended here if `tls`) as `name`;
    raises OSError or h11 errors on a broken peer (the caller resets)."""
    gr, gw = guest
    ctx = upstream_tls or ic.upstream_tls
    if up.sock is not None:
        ur, uw = await asyncio.open_connection(sock=up.sock, ssl=ctx if tls else None,
                                               server_hostname=name if tls else None)  # fmt: skip
    else:
        assert up.reader is not None and up.writer is not None
        ur, uw = up.reader, up.writer
        if tls:
            await uw.start_tls(ctx, server_hostname=name)
    try:
        await _requests(gr, gw, ur, uw, lambda: _headers(rule, ic))  # per request
    finally:
        for w in (uw, gw):
            w.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await w.wait_closed()


async def serve_intercepted(conn: socket.socket, up: Tunnel, name: str, tls: bool, rule: Rule,
                            ic: Interceptor, upstream_tls: ssl.SSLContext | None = None
                            ) -> None:  # fmt: skip
    """The whole of an intercepted connection: TLS with the guest as `name` (if `tls`), the
    requests rewritten, both sides closed at the end (reset on any failure).
    `upstream_tls`: instead of the interceptor's (the node's own listener, for the hairpin)."""
    try:
        streams = await guest_streams(conn, ic.ca.server_context(name) if tls else None)
    except (OSError, ssl.SSLError) as e:  # the guest refused the certificate, or left
        log.debug("intercept: %s: TLS with the guest: %r", name, e)
        up.close(rst=True)
        return
    try:
        await intercept(streams, up, name, tls, rule, ic, upstream_tls)
    except (Exception, asyncio.CancelledError) as e:  # a broken peer, or an update
        log.debug("intercept: %s: %r", name, e)
        up.close(rst=True)
        streams[1].transport.abort()


async def _headers(rule: Rule, ic: Interceptor) -> list[tuple[bytes, bytes]]:
    values: dict[str, str] = {}
    for n in rule.secret_names():
        if ic.secret is None:
            raise _Refused("this node has no secrets")
        try:
            values[n] = await ic.secret(rule.owner, n)
        except LookupError as e:
            raise _Refused(f"secret {n!r} is gone") from e
        except ValueError as e:  # the store's not-found is a ValueError (SecretNotFound)
            raise _Refused(str(e)) from e
    return [(k.lower().encode(), v.encode()) for k, v in resolve(rule, values.__getitem__)]


async def _event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    while True:
        ev = conn.next_event()
        if ev is h11.NEED_DATA:
            conn.receive_data(await reader.read(CHUNK))
            continue
        return ev


async def _requests(gr: asyncio.StreamReader, gw: asyncio.StreamWriter,
                    ur: asyncio.StreamReader, uw: asyncio.StreamWriter,
                    extra: Callable[[], Awaitable[list[tuple[bytes, bytes]]]]
                    ) -> None:  # fmt: skip
    guest, upstream = h11.Connection(h11.SERVER), h11.Connection(h11.CLIENT)
    while True:
        ev = await _event(guest, gr)
        if not isinstance(ev, h11.Request):
            return  # the guest closed
        try:
            add = await extra()
        except _Refused as e:
            await _answer_502(guest, gw, str(e))
            return
        names = {k for k, _ in add}
        headers = [(k, v) for k, v in ev.headers if k not in names and k != b"expect"]
        if guest.client_is_waiting_for_100_continue:
            gw.write(guest.send(h11.InformationalResponse(status_code=100, headers=[])))
        uw.write(upstream.send(h11.Request(method=ev.method, target=ev.target,
                                           headers=headers + add)))  # h11 speaks 1.1
        while not isinstance(ev := await _event(guest, gr), h11.EndOfMessage):
            if not isinstance(ev, h11.Data):
                return
            uw.write(upstream.send(ev))
            await uw.drain()
        uw.write(upstream.send(ev))
        await uw.drain()
        while not isinstance(ev := await _event(upstream, ur), h11.EndOfMessage):
            if not isinstance(ev, h11.InformationalResponse | h11.Response | h11.Data):
                return  # the server closed mid-answer: the guest sees its connection end
            gw.write(guest.send(_as_ours(ev)))
            await gw.drain()
            if isinstance(ev, h11.InformationalResponse) and ev.status_code == 101:
                await _bytes_both_ways(gr, gw, ur, uw, guest.trailing_data[0],
                                       upstream.trailing_data[0])  # fmt: skip
                return
        gw.write(guest.send(ev))
        await gw.drain()
        if h11.MUST_CLOSE in (guest.our_state, guest.their_state, upstream.our_state,
                              upstream.their_state):  # fmt: skip
            return
        guest.start_next_cycle()
        upstream.start_next_cycle()


def _as_ours(ev: object) -> object:
    """An answer event to pass on: h11 writes HTTP/1.1 only, whatever the server spoke."""
    if isinstance(ev, h11.InformationalResponse | h11.Response):
        return type(ev)(status_code=ev.status_code, headers=ev.headers, reason=ev.reason)
    return ev


async def _answer_502(guest: h11.Connection, gw: asyncio.StreamWriter, why: str) -> None:
    body = f"aenv egress: {why}\n".encode()
    gw.write(guest.send(h11.Response(status_code=502, headers=[
        ("content-type", "text/plain"), ("content-length", str(len(body))),
        ("connection", "close")])))  # fmt: skip
    gw.write(guest.send(h11.Data(data=body)) + guest.send(h11.EndOfMessage()))
    await gw.drain()


async def _bytes_both_ways(gr: asyncio.StreamReader, gw: asyncio.StreamWriter,
                           ur: asyncio.StreamReader, uw: asyncio.StreamWriter,
                           from_guest: bytes, from_up: bytes) -> None:  # fmt: skip
    async def copy(r: asyncio.StreamReader, w: asyncio.StreamWriter, first: bytes) -> None:
        if first:
            w.write(first)
        while data := await r.read(CHUNK):
            w.write(data)
            await w.drain()

    tasks = [asyncio.ensure_future(copy(gr, uw, from_guest)),
             asyncio.ensure_future(copy(ur, gw, from_up))]  # fmt: skip
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
