"""What a template build asks of the agent in its build VM: run a command (its output line by
line), start one in the background, and write a file. The agent's own protocol: Connect
server streams of JSON envelopes for processes, plain HTTP for files."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx

FLAG_END = 0x02
MAX_MESSAGE = 4 << 20
RUN_TIMEOUT_S = 3600.0
FILE_TIMEOUT_S = 600.0


class AgentError(Exception):
    def __init__(self, message: str, code: str = "unknown") -> None:
        super().__init__(message)
        self.code = code


async def _chunks(path: Path, size: int = 1 << 20) -> AsyncIterator[bytes]:
    with path.open("rb") as f:
        while chunk := await asyncio.to_thread(f.read, size):
            yield chunk


def _basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode()


class BuildAgent:
    def __init__(self, url: str, token: str | None) -> None:
        headers = {"X-Access-Token": token} if token else {}
        self.http = httpx.AsyncClient(base_url=url, headers=headers,
                                      timeout=httpx.Timeout(RUN_TIMEOUT_S, connect=10.0))

    async def close(self) -> None:
        await self.http.aclose()

    async def run(self, cmd: str, *, user: str, cwd: str | None = None,
                  env: dict[str, str] | None = None,
                  on_line: Callable[[str], None] | None = None,
                  on_output: Callable[[str, bytes], None] | None = None,
                  background: bool = False, tag: str | None = None) -> int:
        """`/bin/bash -l -c cmd` as `user`: its exit code (stdout and stderr go to `on_line`
        a line at a time, and to `on_output` as they come, with their stream's name).
        `background`: return once it started (-1), leaving it running."""
        process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", cmd],
                                   "envs": env or {}}  # fmt: skip
        if cwd:
            process["cwd"] = cwd
        body = json.dumps({"process": process} | ({"tag": tag} if tag else {})).encode()
        headers = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1",
                   "Authorization": _basic(user)}  # fmt: skip
        req = self.http.build_request("POST", "/process.Process/Start",
                                      content=struct.pack(">BI", 0, len(body)) + body,
                                      headers=headers)  # fmt: skip
        r = await self.http.send(req, stream=True)
        try:
            if r.status_code != 200:
                raise self._error(await r.aread())
            partial = {"stdout": b"", "stderr": b""}
            async for msg in self._messages(r):
                event = msg.get("event") or {}
                if "start" in event and background:
                    return -1
                data = event.get("data") or {}
                for stream in ("stdout", "stderr"):
                    if data.get(stream):
                        chunk = base64.b64decode(data[stream])
                        if on_output is not None:
                            on_output(stream, chunk)
                        partial[stream] = self._lines(partial[stream] + chunk, on_line)
                if "end" in event:
                    for rest in partial.values():
                        if rest and on_line is not None:
                            on_line(rest.decode(errors="replace"))
                    end = event["end"]
                    return int(end.get("exitCode", end.get("exit_code", 0)) or 0)
        finally:
            await r.aclose()
        raise AgentError(f"the agent's stream for {cmd!r} ended without an exit", "unavailable")

    @staticmethod
    def _lines(buf: bytes, on_line: Callable[[str], None] | None) -> bytes:
        *lines, rest = buf.split(b"\n")
        if on_line is not None:
            for ln in lines:
                on_line(ln.decode(errors="replace"))
        return rest

    async def _messages(self, r: httpx.Response):  # type: ignore[no-untyped-def]
        buf = bytearray()
        async for chunk in r.aiter_raw():
            buf += chunk
            while len(buf) >= 5:
                flags, length = struct.unpack(">BI", bytes(buf[:5]))
                if length > MAX_MESSAGE:
                    raise AgentError(f"the agent sent a {length}-byte message")
                if len(buf) < 5 + length:
                    break
                payload = bytes(buf[5:5 + length])
                del buf[:5 + length]
                msg = json.loads(payload) if payload else {}
                if flags & FLAG_END:
                    err = msg.get("error")
                    if err:
                        raise AgentError(str(err.get("message") or err.get("code")),
                                         str(err.get("code") or "unknown"))  # fmt: skip
                    return
                yield msg

    @staticmethod
    def _error(body: bytes) -> AgentError:
        try:
            doc = json.loads(body)
            return AgentError(str(doc.get("message") or body[:200]), str(doc.get("code") or
                                                                         "unknown"))
        except ValueError:
            return AgentError(body[:200].decode(errors="replace"))

    async def forget_token(self) -> None:
        """The agent drops its access token: a template's snapshot holds no build secret, and
        every sandbox made from it gets its own token from its own `/init`."""
        r = await self.http.post("/init", json={"accessToken": None})
        if r.status_code >= 300:
            raise self._error(r.content)

    async def read(self, path: str, *, user: str = "root", limit: int = 1 << 20) -> bytes | None:
        """The file's first `limit` bytes; None if it does not exist."""
        headers = {"Authorization": _basic(user)}
        async with self.http.stream("GET", "/files", params={"path": path},
                                    headers=headers, timeout=FILE_TIMEOUT_S) as r:
            if r.status_code == 404:
                return None
            if r.status_code != 200:
                raise self._error(await r.aread())
            out = bytearray()
            async for chunk in r.aiter_bytes():
                out += chunk[: limit - len(out)]
                if len(out) >= limit:
                    break
            return bytes(out)

    async def write(self, path: str, data: bytes | Path, *, user: str = "root") -> None:
        """`data`, or the file at that host path (streamed: layers may be large)."""
        headers = {"Content-Type": "application/octet-stream", "Authorization": _basic(user)}
        content: bytes | AsyncIterator[bytes]
        if isinstance(data, Path):
            headers["Content-Length"] = str(data.stat().st_size)
            content = _chunks(data)
        else:
            content = data
        r = await self.http.post("/files", params={"path": path}, content=content,
                                 headers=headers, timeout=FILE_TIMEOUT_S)  # fmt: skip
        if r.status_code != 200:
            raise self._error(r.content)
