"""A WebSocket echo server in the standard library alone, to run inside a guest (whose
`python3` has no third-party packages): `python3 ws_echo.py PORT`.

Echoes text and binary messages with their type, answers pings, and echoes a close frame
(code and reason) before closing. A text message `close:<code>:<reason>` makes it close
first with that code. Fragmented messages are not supported (nobody here sends them).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
import sys

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_TEXT, _BINARY, _CLOSE, _PING, _PONG = 1, 2, 8, 9, 10


def _frame(opcode: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


async def _read_frame(r: asyncio.StreamReader) -> tuple[int, bytes]:
    b0, b1 = await r.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await r.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await r.readexactly(8))
    mask = await r.readexactly(4) if b1 & 0x80 else b""
    data = await r.readexactly(n)
    if mask and n:
        key = (mask * (n // 4 + 1))[:n]
        data = (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
    return b0 & 0x0F, data


async def _serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        head = (await r.readuntil(b"\r\n\r\n")).decode("latin-1")
        key = ""
        protocols = ""
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "sec-websocket-key":
                key = value.strip()
            elif name.strip().lower() == "sec-websocket-protocol":
                protocols = value.strip()
        accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
        chosen = protocols.split(",")[0].strip()
        extra = f"Sec-WebSocket-Protocol: {chosen}\r\n" if chosen else ""
        w.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n{extra}\r\n")
                .encode())  # fmt: skip
        while True:
            op, data = await _read_frame(r)
            if op == _CLOSE:
                w.write(_frame(_CLOSE, data))  # the same code and reason back
                break
            if op == _PING:
                w.write(_frame(_PONG, data))
            elif op == _TEXT and data.startswith(b"close:"):
                _, code, reason = data.decode().split(":", 2)
                w.write(_frame(_CLOSE, struct.pack("!H", int(code)) + reason.encode()))
                await _read_frame(r)  # the client's answering close
                break
            elif op in (_TEXT, _BINARY):
                w.write(_frame(op, data))
            await w.drain()
        await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        w.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(_serve, "0.0.0.0", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
