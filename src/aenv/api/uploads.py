"""`PUT /_aenv/build-files/{hash}?exp=&sig=`: a build context archive, streamed to disk.

Served before the control plane (whose bodies are small JSON): the URL's signature is its
authorisation (the SDK sends no API key with it), the body may be large (up to the node's
`build_context_max_bytes`, 413 beyond), and a cut-off upload leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any
from urllib.parse import parse_qs

from aenv.api import errors
from aenv.api.relay import send_json
from aenv.images.context import UPLOAD_PREFIX, ContextError, ContextStore

# An over-large body is read on (and dropped) for up to this many bytes more before the
# 413: answering while the client still sends makes the close a reset, and the client then
# reports a broken connection instead of the 413 (seen in CI). Beyond it, the 413 goes out
# at once.
DRAIN_BYTES = 64 << 20


async def _drain(receive: Any, msg: dict[str, Any], limit: int) -> None:
    seen = len(msg.get("body", b""))
    while msg.get("more_body", False) and seen <= limit:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return
        seen += len(msg.get("body", b""))


def is_upload(scope: dict[str, Any]) -> bool:
    return scope["type"] == "http" and scope["path"].startswith(UPLOAD_PREFIX)


async def handle(store: ContextStore | None, scope: dict[str, Any], receive: Any,
                 send: Any) -> None:
    async def fail(status: int, message: str) -> None:
        await send_json(send, status, errors.body(status, message))

    if store is None:
        return await fail(404, "this node builds no templates")
    if scope["method"] != "PUT":
        return await fail(405, "build files are uploaded with PUT")
    files_hash = scope["path"][len(UPLOAD_PREFIX):]
    q = parse_qs(scope.get("query_string", b"").decode())
    try:
        store.path(files_hash)
    except ContextError as e:
        return await fail(400, str(e))
    if not store.verify(files_hash, q.get("exp", [""])[0], q.get("sig", [""])[0]):
        return await fail(401, "the upload URL is invalid or has expired: ask for a new one")
    staged = store.staging(files_hash)
    size = 0
    failure: tuple[int, str] | None = None
    try:
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return None
                chunk = msg.get("body", b"")
                size += len(chunk)
                if size > store.max_bytes:
                    await _drain(receive, msg, store.max_bytes + DRAIN_BYTES)
                    failure = (413, f"the build context exceeds {store.max_bytes} bytes")
                    break
                f.write(chunk)
                if not msg.get("more_body", False):
                    break
        if failure is None:
            try:
                store.commit(staged, files_hash)
            except ContextError as e:
                failure = (400, str(e))
    finally:
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()
    # Answered only now: a client that sees the answer finds nothing of its upload left.
    if failure is not None:
        return await fail(*failure)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"0")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b""})
    return None
