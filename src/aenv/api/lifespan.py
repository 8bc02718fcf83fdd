"""The ASGI lifespan of a node or a gateway: start on startup (a failure is reported to
the server, which then exits non-zero), close on shutdown."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("aenv.api")


async def lifespan(receive: Any, send: Any, start: Callable[[], Awaitable[None]],
                   close: Callable[[], Awaitable[None]], what: str) -> None:  # fmt: skip
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            try:
                await start()
            except Exception as e:
                log.exception("%s.start_failed", what)
                await send({"type": "lifespan.startup.failed", "message": repr(e)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            try:
                await close()
            except Exception:
                log.exception("%s.close_failed", what)
            await send({"type": "lifespan.shutdown.complete"})
            return
