"""The sandbox's data plane (E2B's envd protocol) through the node, over plain httpx.

Requests go to the node's origin with `E2b-Sandbox-Id`, `E2b-Sandbox-Port: 49983` and the
sandbox's `X-Access-Token`; the node forwards them to the agent in the VM. RPCs are Connect
over HTTP/1.1 with the JSON codec (e2b-compat.md section 4): unary calls are one JSON body
each way; server streams are enveloped (1 flag byte, 4-byte big-endian length, JSON). Files
move through `GET`/`POST /files` as raw bytes.

The CLI speaks this itself rather than through the `e2b` SDK so that command output keeps its
exact bytes (the SDK decodes stdout as UTF-8) and so the CLI needs no SDK at run time.
"""

from __future__ import annotations

import base64
import contextlib
import json
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import aenv
from aenv.cli.client import error_message, transport_error
from aenv.cli.errors import CliError

ENVD_PORT = 49983
KEEPALIVE_S = 30  # asked of the agent on streams; a silent stream past STREAM_IDLE_S is dead
STREAM_IDLE_S = 150.0
UNARY_TIMEOUT_S = 60.0
FLAG_END = 0x02
# Everything below comes from the sandbox, which is untrusted: each read is capped.
MAX_UNARY_BYTES = 64 << 20  # one unary reply (ListDir of a large tree is the biggest)
MAX_MESSAGE_BYTES = 16 << 20  # one streamed message (a chunk of process output)
MAX_ERROR_BYTES = 64 << 10  # an error reply's body
MAX_PATH_CHARS = 4096  # PATH_MAX


class EnvdError(CliError):
    """An error answered by the agent (`code` is the Connect code) or by the node's proxy."""

    def __init__(self, message: str, code: str = "unknown", status: int = 0) -> None:
        super().__init__(message)
        self.connect_code = code
        self.status = status


class SandboxGone(EnvdError):
    """The node has no running sandbox by that id (paused, killed or expired)."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


class Envd:
    def __init__(self, origin: str, sandbox_id: str, access_token: str | None) -> None:
        self.sandbox_id = sandbox_id
        self.origin = origin
        headers = {
            "E2b-Sandbox-Id": sandbox_id,
            "E2b-Sandbox-Port": str(ENVD_PORT),
            "User-Agent": f"aenv-cli/{aenv.__version__}",
        }
        if access_token:
            headers["X-Access-Token"] = access_token
        self.http = httpx.Client(
            base_url=origin, headers=headers,
            timeout=httpx.Timeout(UNARY_TIMEOUT_S, connect=5.0),
        )  # fmt: skip

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Envd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- errors -----------------------------------------------------------------------------

    def _error(self, r: httpx.Response) -> EnvdError:
        msg = error_message(r)
        if r.status_code == 502 and "was not found" in msg:
            return SandboxGone(f"sandbox {self.sandbox_id} is not running "
                               "(paused, removed or timed out)", "unavailable", 502)  # fmt: skip
        code = "unknown"
        with contextlib.suppress(ValueError):
            body = r.json()
            if isinstance(body, dict) and isinstance(body.get("code"), str):
                code = body["code"]
        if r.status_code == 401:
            msg = f"the sandbox refused its access token ({msg})"
        return EnvdError(msg, code, r.status_code)

    # --- Connect RPCs -----------------------------------------------------------------------

    def _send_capped(self, method: str, path: str, cap: int, **kwargs: Any) -> httpx.Response:
        """A request whose reply is read whole, but never more than `cap` bytes of it."""
        req = self.http.build_request(method, path, **kwargs)
        try:
            r = self.http.send(req, stream=True)
            try:
                return _read_capped(r, cap if r.status_code == 200 else MAX_ERROR_BYTES)
            finally:
                r.close()
        except httpx.HTTPError as e:
            raise transport_error(self.origin, e) from None

    def unary(self, rpc: str, message: dict[str, Any]) -> dict[str, Any]:
        r = self._send_capped("POST", f"/{rpc}", MAX_UNARY_BYTES, json=message,
                              headers={"Connect-Protocol-Version": "1"})  # fmt: skip
        if r.status_code != 200:
            raise self._error(r)
        return _json_object(r.content) if r.content else {}

    @contextlib.contextmanager
    def stream(self, rpc: str, message: dict[str, Any]) -> Iterator[Iterator[dict[str, Any]]]:
        """A server stream: yields an iterator of its messages (the end-stream error raises)."""
        headers = {
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            "Keepalive-Ping-Interval": str(KEEPALIVE_S),
        }
        timeout = httpx.Timeout(UNARY_TIMEOUT_S, connect=5.0, read=STREAM_IDLE_S)
        req = self.http.build_request("POST", f"/{rpc}", content=envelope(message),
                                      headers=headers, timeout=timeout)  # fmt: skip
        try:
            r = self.http.send(req, stream=True)
        except httpx.HTTPError as e:
            raise transport_error(self.origin, e) from None
        try:
            if r.status_code != 200:
                raise self._error(_read_capped(r, MAX_ERROR_BYTES))
            yield self._messages(r)
        finally:
            r.close()

    def _messages(self, r: httpx.Response) -> Iterator[dict[str, Any]]:
        buf = bytearray()
        try:
            for chunk in r.iter_raw():
                buf += chunk
                while len(buf) >= 5:
                    flags, length = struct.unpack(">BI", bytes(buf[:5]))
                    if length > MAX_MESSAGE_BYTES:
                        raise EnvdError(f"sandbox {self.sandbox_id} sent a {length}-byte "
                                        f"message (limit {MAX_MESSAGE_BYTES})",
                                        "resource_exhausted")  # fmt: skip
                    if len(buf) < 5 + length:
                        break
                    payload = bytes(buf[5:5 + length])
                    del buf[:5 + length]
                    msg = _json_object(payload) if payload else {}
                    if flags & FLAG_END:
                        err = msg.get("error")
                        if err:
                            raise EnvdError(str(err.get("message") or err.get("code")),
                                            str(err.get("code", "unknown")))  # fmt: skip
                        return
                    yield msg
        except httpx.HTTPError as e:
            raise SandboxGone(f"lost the connection to sandbox {self.sandbox_id} "
                              f"({type(e).__name__}): it was paused, removed or timed out, "
                              "or the node stopped", "unavailable") from None  # fmt: skip
        raise SandboxGone(f"the stream from sandbox {self.sandbox_id} ended early: it was "
                          "paused, removed or timed out, or the node stopped",
                          "unavailable")  # fmt: skip

    # --- processes --------------------------------------------------------------------------

    def start(self, cmd: str, args: list[str], *, envs: dict[str, str] | None = None,
              cwd: str | None = None, pty: tuple[int, int] | None = None,
              stdin: bool = False) -> contextlib.AbstractContextManager[Iterator[dict[str, Any]]]:
        """process.Process/Start; `pty` is (cols, rows). Events: start, data, end, keepalive."""
        process: dict[str, Any] = {"cmd": cmd, "args": args, "envs": envs or {}}
        if cwd:
            process["cwd"] = cwd
        message: dict[str, Any] = {"process": process}
        if pty is not None:
            message["pty"] = {"size": {"cols": pty[0], "rows": pty[1]}}
        if stdin:
            message["stdin"] = True
        return self.stream("process.Process/Start", message)

    def send_input(self, pid: int, data: bytes, *, pty: bool = False) -> None:
        self.unary("process.Process/SendInput", {
            "process": {"pid": pid}, "input": {"pty" if pty else "stdin": b64(data)}})

    def close_stdin(self, pid: int) -> None:
        self.unary("process.Process/CloseStdin", {"process": {"pid": pid}})

    def resize(self, pid: int, cols: int, rows: int) -> None:
        self.unary("process.Process/Update", {
            "process": {"pid": pid}, "pty": {"size": {"cols": cols, "rows": rows}}})

    def signal(self, pid: int, name: str = "SIGKILL") -> bool:
        try:
            self.unary("process.Process/SendSignal",
                       {"process": {"pid": pid}, "signal": f"SIGNAL_{name}"})  # fmt: skip
        except EnvdError as e:
            if e.connect_code == "not_found":
                return False
            raise
        return True

    # --- filesystem -------------------------------------------------------------------------

    def stat(self, path: str) -> dict[str, Any] | None:
        try:
            return checked_entry(self.unary("filesystem.Filesystem/Stat",
                                            {"path": path}).get("entry", {}))
        except EnvdError as e:
            if e.connect_code == "not_found":
                return None
            raise

    def list_dir(self, path: str, depth: int = 1) -> list[dict[str, Any]]:
        out = self.unary("filesystem.Filesystem/ListDir", {"path": path, "depth": depth})
        entries = out.get("entries", [])
        if not isinstance(entries, list):
            raise EnvdError("the sandbox sent a malformed directory listing", "internal")
        return [checked_entry(e) for e in entries]

    def make_dir(self, path: str) -> None:
        try:
            self.unary("filesystem.Filesystem/MakeDir", {"path": path})
        except EnvdError as e:
            if e.connect_code != "already_exists":
                raise

    @contextlib.contextmanager
    def download(self, path: str) -> Iterator[httpx.Response]:
        timeout = httpx.Timeout(UNARY_TIMEOUT_S, connect=5.0, read=STREAM_IDLE_S)
        req = self.http.build_request("GET", "/files", params={"path": path}, timeout=timeout)
        try:
            r = self.http.send(req, stream=True)
        except httpx.HTTPError as e:
            raise transport_error(self.origin, e) from None
        try:
            if r.status_code != 200:
                raise self._error(_read_capped(r, MAX_ERROR_BYTES))
            yield r
        finally:
            r.close()

    def upload(self, path: str, chunks: Iterable[bytes]) -> None:
        """Write `chunks` to `path` (parents are created), streamed as a chunked body."""
        timeout = httpx.Timeout(UNARY_TIMEOUT_S, connect=5.0, write=STREAM_IDLE_S,
                                read=STREAM_IDLE_S)  # fmt: skip
        r = self._send_capped("POST", "/files", MAX_ERROR_BYTES, params={"path": path},
                              content=chunks, timeout=timeout,
                              headers={"Content-Type": "application/octet-stream"})  # fmt: skip
        if r.status_code != 200:
            raise self._error(r)


def _read_capped(r: httpx.Response, cap: int) -> httpx.Response:
    """`r` (a streamed response) read whole into a new response; EnvdError past `cap`."""
    body = bytearray()
    for chunk in r.iter_bytes():
        body += chunk
        if len(body) > cap:
            raise EnvdError(f"the sandbox's reply exceeds {cap} bytes", "resource_exhausted")
    # The body is decoded already: the new response must not decode it again.
    headers = [(k, v) for k, v in r.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(r.status_code, headers=headers, content=bytes(body),
                          request=r.request)  # fmt: skip


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError):
        raise EnvdError("the sandbox sent malformed JSON", "internal") from None
    if not isinstance(msg, dict):
        raise EnvdError("the sandbox sent a JSON value that is not an object", "internal")
    return msg


class _Entry(BaseModel):
    """An EntryInfo as the CLI uses it, type- and range-checked (the sandbox is untrusted)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    path: str = Field("", max_length=MAX_PATH_CHARS)
    name: str = Field("", max_length=MAX_PATH_CHARS)
    type: str | int | None = None
    size: int = Field(0, ge=0, le=(1 << 63) - 1)
    mode: int = Field(0o644, ge=0, le=0xFFFFFFFF)  # uint32
    symlinkTarget: str | None = Field(None, max_length=MAX_PATH_CHARS)
    isSymlink: bool = True


def checked_entry(raw: object) -> dict[str, Any]:
    """A checked EntryInfo (protobuf JSON: int64 fields may come as strings)."""
    if isinstance(raw, dict):
        raw = {k: int(v) if k in ("size", "mode") and isinstance(v, str) and v.isdigit()
               and len(v) < 20 else v for k, v in raw.items()}  # fmt: skip
    try:
        return _Entry.model_validate(raw).model_dump()
    except ValidationError as e:
        raise EnvdError(f"the sandbox sent a malformed file entry: {e.errors()[0]['msg']}",
                        "internal") from None  # fmt: skip


def file_type(entry: dict[str, Any]) -> str:
    """'file', 'dir' or 'other' from an EntryInfo (enum names or numbers)."""
    t = entry.get("type")
    if t in ("FILE_TYPE_DIRECTORY", 2):
        return "dir"
    if t in ("FILE_TYPE_FILE", 1):
        return "file"
    return "other"
