"""A test-only E2B control plane: just enough for the unmodified SDK to create, connect,
inspect and kill "sandboxes" that all point at one agent (``E2B_SANDBOX_URL``).

Template ids steer the envd access token the SDK receives: ``wrong-token`` gives a bogus
token, ``no-token`` gives none; anything else gets the agent's real token.
"""

from __future__ import annotations

import json
import secrets
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ControlPlaneStub:
    """Serves the control-plane routes on ``127.0.0.1:<random port>`` in a thread."""

    def __init__(self, *, envd_version: str, envd_token: str | None, api_key: str) -> None:
        self.envd_version = envd_version
        self.envd_token = envd_token
        self.api_key = api_key
        self.sandboxes: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ControlPlaneStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        template = body.get("templateID") or "base"
        now = datetime.now(UTC)
        sbx: dict[str, Any] = {
            "templateID": template,
            "sandboxID": "sbx" + secrets.token_hex(6),
            "clientID": "stub",
            "envdVersion": self.envd_version,
            "domain": None,
            "alias": template,
            "metadata": body.get("metadata") or {},
            "startedAt": now.isoformat(),
            "endAt": (now + timedelta(seconds=int(body.get("timeout") or 300))).isoformat(),
        }
        if template == "wrong-token":
            sbx["envdAccessToken"] = "bogus-" + secrets.token_hex(8)
        elif template != "no-token" and self.envd_token:
            sbx["envdAccessToken"] = self.envd_token
        with self.lock:
            self.sandboxes[sbx["sandboxID"]] = sbx
        return sbx

    @staticmethod
    def public(sbx: dict[str, Any]) -> dict[str, Any]:
        keys = ("templateID", "sandboxID", "clientID", "envdVersion", "domain", "alias")
        out = {k: sbx[k] for k in keys}
        if "envdAccessToken" in sbx:
            out["envdAccessToken"] = sbx["envdAccessToken"]
        return out

    @staticmethod
    def detail(sbx: dict[str, Any]) -> dict[str, Any]:
        out = ControlPlaneStub.public(sbx)
        out.update(
            startedAt=sbx["startedAt"], endAt=sbx["endAt"], cpuCount=1, memoryMB=256,
            diskSizeMB=1024, state="running", metadata=sbx["metadata"],
        )  # fmt: skip
        return out


def _handler(stub: ControlPlaneStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        replied = False

        def _reply(self, status: int, payload: object = None) -> None:
            self.replied = True
            body = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            if payload is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            return json.loads(raw) if raw else {}

        def _authorized(self) -> bool:
            if self.headers.get("X-API-KEY") != stub.api_key:
                self._reply(401, {"code": 401, "message": "invalid API key"})
                return False
            return True

        def _sandbox(self, sid: str) -> dict[str, Any] | None:
            with stub.lock:
                sbx = stub.sandboxes.get(sid)
            if sbx is None:
                self._reply(404, {"code": 404, "message": f"sandbox {sid} not found"})
            return sbx

        def do_POST(self) -> None:
            self.replied = False
            if not self._authorized():
                return
            parts = self.path.split("?")[0].strip("/").split("/")
            body = self._body()
            if parts in (["v2", "sandboxes"], ["sandboxes"]):
                self._reply(201, stub.public(stub.create(body)))
            elif parts[-1] == "connect" and (sbx := self._sandbox(parts[-2])):
                self._reply(200, stub.public(sbx))
            elif parts[-1] == "timeout" and (sbx := self._sandbox(parts[-2])):
                timeout = int(body.get("timeout", 300))
                sbx["endAt"] = (datetime.now(UTC) + timedelta(seconds=timeout)).isoformat()
                self._reply(204)
            self._fallback()

        def _fallback(self) -> None:
            if not self.replied:
                self._reply(404, {"code": 404, "message": "not found"})

        def do_GET(self) -> None:
            self.replied = False
            if not self._authorized():
                return
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts in (["v2", "sandboxes"], ["sandboxes"]):
                with stub.lock:
                    items = [stub.detail(s) for s in stub.sandboxes.values()]
                self._reply(200, items)
            elif len(parts) == 2 and parts[0] == "sandboxes" and (sbx := self._sandbox(parts[1])):
                self._reply(200, stub.detail(sbx))
            elif len(parts) == 3 and parts[2] == "metrics" and self._sandbox(parts[1]):
                self._reply(200, [])
            self._fallback()

        def do_DELETE(self) -> None:
            self.replied = False
            if not self._authorized():
                return
            parts = self.path.split("?")[0].strip("/").split("/")
            if len(parts) == 2 and parts[0] == "sandboxes":
                with stub.lock:
                    gone = stub.sandboxes.pop(parts[1], None)
                if gone is None:
                    self._reply(404, {"code": 404, "message": "not found"})
                else:
                    self._reply(204)
            else:
                self._reply(404, {"code": 404, "message": "not found"})

    return Handler
