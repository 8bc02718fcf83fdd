"""The gateway's own client, on a create: its request body, and whether it has left."""

from __future__ import annotations

import asyncio
from typing import Any


async def read_body(receive: Any, limit: int) -> bytes | None:
    data = bytearray()
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return bytes(data)
        data += msg.get("body", b"")
        if len(data) > limit:
            return None
        if not msg.get("more_body", False):
            return bytes(data)


def watch(receive: Any) -> asyncio.Task[Any]:
    """Once a request's body is read, the next ASGI message is its client leaving."""
    return asyncio.get_running_loop().create_task(receive())


def has_left(watcher: asyncio.Task[Any]) -> bool:
    return (watcher.done() and not watcher.cancelled() and watcher.exception() is None
            and watcher.result().get("type") == "http.disconnect")  # fmt: skip
