"""The agent's ASGI app in-process (no sockets, no processes): Connect unary and
server-stream framing, error codes and statuses, the access token, HTTP routes."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import struct
from pathlib import Path

import pytest

from aenv.guest.agent.app import AgentApp
from aenv.guest.agent.options import AgentOptions
from aenv.guest.agent.processes import ProcessTable
from aenv.guest.agent.spawn import SpawnPolicy
from aenv.guest.agent.state import SandboxState
from aenv.guest.agent.watchers import WatcherRegistry


class Response:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.done = asyncio.Event()

    def json(self) -> object:
        return json.loads(self.body)

    def envelopes(self) -> list[tuple[int, object]]:
        out, i = [], 0
        while i < len(self.body):
            flags, n = struct.unpack(">BI", self.body[i : i + 5])
            out.append((flags, json.loads(self.body[i + 5 : i + 5 + n])))
            i += 5 + n
        return out


@pytest.fixture
async def app() -> AgentApp:
    loop = asyncio.get_running_loop()
    state = SandboxState(default_user="root")
    table = ProcessTable(loop, SpawnPolicy())
    watchers = WatcherRegistry(loop.add_reader, loop.remove_reader)
    yield AgentApp(AgentOptions(set_clock=False, cgroup_root=None), state, table, watchers)
    watchers.close_all()
    loop.remove_signal_handler(__import__("signal").SIGCHLD)


async def call(
    app: AgentApp,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    query: str = "",
    until: bytes | None = None,
) -> Response:
    """Run one request. ``until``: stop a stream once the body contains it."""
    resp = Response()
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await resp.done.wait()
        return {"type": "http.disconnect"}

    async def send(msg: dict) -> None:
        if msg["type"] == "http.response.start":
            resp.status = msg["status"]
            resp.headers = {k.decode(): v.decode() for k, v in msg["headers"]}
        else:
            resp.body += msg.get("body", b"")
            if not msg.get("more_body") or (until is not None and until in resp.body):
                resp.done.set()

    scope = {
        "type": "http", "method": method, "path": path, "root_path": "",
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }  # fmt: skip
    task = asyncio.create_task(app(scope, receive, send))
    await asyncio.wait_for(resp.done.wait(), 5)
    if until is not None:
        task.cancel()
    else:
        await task
    return resp


def envelope(msg: object) -> bytes:
    raw = json.dumps(msg).encode()
    return struct.pack(">BI", 0, len(raw)) + raw


UNARY = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
STREAM = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}


async def test_unary_success_is_camel_case_json(app: AgentApp, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    body = json.dumps({"path": str(tmp_path / "f")}).encode()
    r = await call(app, "POST", "/filesystem.Filesystem/Stat", body, UNARY)
    assert r.status == 200 and r.headers["content-type"].startswith("application/json")
    entry = r.json()["entry"]
    assert entry["size"] == "3"  # int64 as a string
    assert entry["type"] == "FILE_TYPE_FILE"
    assert entry["modifiedTime"].endswith("Z")
    assert "isSymlink" not in entry  # defaults are omitted


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [("/definitely/not/here", 404, "not_found"), ("~nobody/x", 400, "invalid_argument")],
)
async def test_unary_errors(app: AgentApp, path: str, status: int, code: str) -> None:
    r = await call(
        app, "POST", "/filesystem.Filesystem/Stat", json.dumps({"path": path}).encode(), UNARY
    )
    assert r.status == status and r.json()["code"] == code and r.json()["message"]


async def test_make_dir_existing_is_already_exists(app: AgentApp, tmp_path: Path) -> None:
    body = json.dumps({"path": str(tmp_path)}).encode()
    r = await call(app, "POST", "/filesystem.Filesystem/MakeDir", body, UNARY)
    assert (r.status, r.json()["code"]) == (409, "already_exists")


async def test_server_stream_envelopes(app: AgentApp, tmp_path: Path) -> None:
    body = envelope({"path": str(tmp_path)})
    r = await call(app, "POST", "/filesystem.Filesystem/WatchDir", body, STREAM, until=b"start")
    assert r.status == 200 and r.headers["content-type"] == "application/connect+json"
    assert r.envelopes()[0] == (0, {"start": {}})


async def test_stream_error_ends_with_an_end_stream_envelope(app: AgentApp) -> None:
    body = envelope({"path": "/no/such/dir"})
    r = await call(app, "POST", "/filesystem.Filesystem/WatchDir", body, STREAM)
    ((flags, msg),) = r.envelopes()
    assert flags == 2 and msg["error"]["code"] == "not_found"


async def test_access_token_rules(app: AgentApp) -> None:
    app.state.access_token = "secret"
    r = await call(app, "POST", "/process.Process/List", b"{}", UNARY)
    assert r.status == 401 and r.json()["code"] == 401
    r = await call(
        app, "POST", "/process.Process/List", b"{}", {**UNARY, "X-Access-Token": "secret"}
    )
    assert r.status == 200 and r.json() == {}
    assert (await call(app, "GET", "/health")).status == 204
    assert (await call(app, "GET", "/envs")).status == 401
    assert (await call(app, "GET", "/files", query="path=/etc/hostname")).status == 401
    r = await call(app, "POST", "/init", json.dumps({"envVars": {"A": "1"}}).encode())
    assert r.status == 204
    r = await call(app, "GET", "/envs", headers={"X-Access-Token": "secret"})
    assert r.json() == {"A": "1"}
    r = await call(app, "POST", "/init", json.dumps({"accessToken": "new"}).encode())
    assert r.status == 204 and app.state.access_token == "new"


async def test_init_validates(app: AgentApp) -> None:
    assert (await call(app, "POST", "/init", b"[1]")).status == 400
    assert (await call(app, "POST", "/init", b"{not json")).status == 400
    r = await call(app, "POST", "/init", json.dumps({"aenvEntropy": "***"}).encode())
    assert r.status == 400


async def test_unknown_routes(app: AgentApp) -> None:
    r = await call(app, "GET", "/nope")
    assert r.status == 404 and r.json() == {"code": 404, "message": "no route for GET /nope"}
    r = await call(app, "PUT", "/files")
    assert r.status == 405


async def test_files_roundtrip_in_process(app: AgentApp, tmp_path: Path) -> None:
    target = tmp_path / "sub" / "x.bin"
    r = await call(
        app, "POST", "/files", b"\x00\x01payload",
        {"Content-Type": "application/octet-stream", "X-Metadata-Owner": "me"},
        query=f"path={target}",
    )  # fmt: skip
    assert r.status == 200
    assert r.json() == [
        {"name": "x.bin", "type": "file", "path": str(target), "metadata": {"owner": "me"}}
    ]
    r = await call(app, "GET", "/files", query=f"path={target}")
    assert r.status == 200 and r.body == b"\x00\x01payload"
    assert r.headers["content-length"] == "9"
    r = await call(app, "GET", "/files", query=f"path={tmp_path}")
    assert r.status == 400 and r.json()["code"] == 400


async def test_a_pseudo_file_is_read_to_its_end(app: AgentApp, tmp_path: Path) -> None:
    """/proc files report 0 bytes: their content is read to EOF, not to st_size."""
    r = await call(app, "GET", "/files", query="path=/proc/self/status")
    assert r.status == 200 and b"Pid:" in r.body and "content-length" not in r.headers
    gz = await call(app, "GET", "/files", headers={"Accept-Encoding": "gzip"},
                    query="path=/proc/self/status")  # fmt: skip
    assert gz.status == 200 and b"Pid:" in gzip.decompress(gz.body)
    (tmp_path / "empty").write_bytes(b"")  # a file that is empty is still empty
    r = await call(app, "GET", "/files", query=f"path={tmp_path / 'empty'}")
    assert r.status == 200 and r.body == b""


async def test_fifos_are_refused_without_blocking(app: AgentApp, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = await call(app, "GET", "/files", query=f"path={fifo}")
    assert r.status == 400
    r = await call(
        app, "POST", "/files", b"x", {"Content-Type": "application/octet-stream"},
        query=f"path={fifo}",
    )  # fmt: skip
    assert r.status == 400
