"""WebSockets through the node's data plane to a server inside a real VM.

The unmodified e2b SDK creates the sandbox and starts a stdlib-only echo server in it
(`tests/support/ws_echo.py`); a WebSocket client then reaches it through the node by header,
prefix and host routing, and killing the sandbox must close the open WebSocket at once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from .conftest import NodeProcess, running_node

pytestmark = pytest.mark.e2e

DOMAIN = "sbx.test"
WS_PORT = 8765
ECHO_SCRIPT = Path(__file__).parent.parent / "support" / "ws_echo.py"
READY_DEADLINE_S = 60  # python3 starting in a TCG guest
CLOSE_DEADLINE_S = 10  # kill -> close frame; generous for a loaded 2-core host


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node with a domain, so `<port>-<id>.<domain>` host routing works."""
    with running_node(tmp_path_factory.mktemp("node"), AENV_DOMAIN=DOMAIN) as n:
        yield n


def _connect(node: NodeProcess, path: str, headers: dict[str, str] | None = None,
             host: str | None = None, **kw: Any) -> ClientConnection:  # fmt: skip
    """A WebSocket to the node's origin; `host` names another origin in the URI (and so in
    the Host header) while the TCP connection still goes to the node."""
    sock = socket.create_connection(("127.0.0.1", node.port), timeout=30)
    uri = f"ws://{host or '127.0.0.1'}:{node.port}{path}"
    return connect(uri, sock=sock, additional_headers=headers, proxy=None, open_timeout=30,
                   **kw)  # fmt: skip


def _routed(sbx: Sandbox) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(WS_PORT)}


def _start_echo_server(node: NodeProcess, sbx: Sandbox) -> None:
    sbx.files.write("/tmp/ws_echo.py", ECHO_SCRIPT.read_text())
    sbx.commands.run(f"python3 /tmp/ws_echo.py {WS_PORT}", background=True)
    deadline = time.monotonic() + READY_DEADLINE_S
    while True:
        try:
            with _connect(node, "/", _routed(sbx)):
                return
        except InvalidStatus as e:  # 502 "port is not open" until the server listens
            body = e.response.body or b""
            if e.response.status_code != 502 or b"port is not open" not in body:
                raise
            assert time.monotonic() < deadline, "the echo server did not start in the guest"
            time.sleep(0.2)


def _echo(ws: ClientConnection) -> None:
    ws.send("héllo")
    assert ws.recv(timeout=30) == "héllo"
    payload = bytes(range(256)) * 256  # 64 KiB, binary
    ws.send(payload)
    got = ws.recv(timeout=30)
    assert isinstance(got, bytes) and got == payload


def test_websocket_to_a_guest_server_and_closed_when_the_sandbox_is_killed(
    node: NodeProcess,
) -> None:
    sbx = Sandbox.create("base", timeout=300)
    try:
        _start_echo_server(node, sbx)
        with _connect(node, "/chat", _routed(sbx), subprotocols=["echo.v1"]) as ws:
            assert ws.subprotocol == "echo.v1"
            _echo(ws)
            ws.send("close:4001:bye")  # the guest closes: its code reaches us
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd is not None
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "bye")
        with _connect(node, f"/proxy/{sbx.sandbox_id}/{WS_PORT}/p") as ws:
            _echo(ws)
        with _connect(node, "/h", host=f"{WS_PORT}-{sbx.sandbox_id}.{DOMAIN}") as ws:
            _echo(ws)

        ws = _connect(node, "/", _routed(sbx))
        try:
            _echo(ws)
            t0 = time.monotonic()
            sbx.kill()
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=CLOSE_DEADLINE_S)
            elapsed = time.monotonic() - t0
        finally:
            ws.close()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert elapsed < CLOSE_DEADLINE_S
        with pytest.raises(InvalidStatus) as refused:
            _connect(node, "/", _routed(sbx))
        assert refused.value.response.status_code == 502
        assert b"was not found" in (refused.value.response.body or b"")
    finally:
        sbx.kill()
