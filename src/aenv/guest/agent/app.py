"""The agent's ASGI application: access-token check, then Connect services or HTTP."""

from __future__ import annotations

import logging

from ..gen.filesystem_connect import FilesystemASGIApplication
from ..gen.process_connect import ProcessASGIApplication
from . import endpoints
from .asgi import ClientGone, HTTPError, Receive, Request, Scope, Send, send_error
from .files_http import FilesEndpoint
from .filesystem_service import FilesystemService
from .metrics import CpuSampler
from .options import AgentOptions
from .process_service import ProcessService
from .processes import ProcessTable
from .state import SandboxState
from .watchers import WatcherRegistry

log = logging.getLogger("aenv.guest.agent")

UNAUTHORIZED = HTTPError(
    401,
    "unauthorized access, please provide a valid access token or method signing if supported",
)


class AgentApp:
    """Routes one request. Exempt from the token (envd's rule): GET /health, POST /init,
    and GET|POST /files (which accept the token or a signature)."""

    def __init__(
        self,
        options: AgentOptions,
        state: SandboxState,
        table: ProcessTable,
        watchers: WatcherRegistry,
    ) -> None:
        self.options = options
        self.state = state
        self.files = FilesEndpoint(state, watchers)
        self.cpu = CpuSampler()
        self.journal = table.journal
        self.process_app = ProcessASGIApplication(ProcessService(table, state))
        self.filesystem_app = FilesystemASGIApplication(FilesystemService(state, watchers))

    def _token_ok(self, scope: Scope) -> bool:
        if not self.state.access_token:
            return True
        for name, value in scope["headers"]:
            if name == b"x-access-token":
                return self.state.token_matches(value.decode("latin-1"))
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path.startswith("/process.Process/"):
            if self._token_ok(scope):
                await self.process_app(scope, receive, send)  # type: ignore[arg-type]
            else:
                await send_error(send, UNAUTHORIZED)
            return
        if path.startswith("/filesystem.Filesystem/"):
            if self._token_ok(scope):
                await self.filesystem_app(scope, receive, send)  # type: ignore[arg-type]
            else:
                await send_error(send, UNAUTHORIZED)
            return
        await self._http(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked_send(message: dict) -> None:  # type: ignore[type-arg]
            nonlocal started
            started = True
            await send(message)

        req = Request(scope, receive)
        try:
            await self._route(req, tracked_send)
        except HTTPError as e:
            if not started:
                await send_error(send, e)
        except ClientGone:
            return
        except Exception:
            log.exception("%s %s failed", req.method, req.path)
            if not started:
                await send_error(send, HTTPError(500, "internal agent error"))

    async def _route(self, req: Request, send: Send) -> None:
        method, path = req.method, req.path
        if path == "/health" and method in ("GET", "HEAD"):
            return await endpoints.health(req, send)
        if path == "/init" and method == "POST":
            return await endpoints.init(self.state, self.options, req, send)
        if path == "/files":
            if method == "GET":
                return await self.files.get(req, send)
            if method == "POST":
                return await self.files.post(req, send)
            raise HTTPError(405, f"method {method} not allowed on /files")
        if not self._token_ok(req.scope):
            raise UNAUTHORIZED
        if path == "/envs" and method == "GET":
            return await endpoints.envs(self.state, send)
        if path == "/metrics" and method == "GET":
            return await endpoints.get_metrics(self.cpu, send)
        if path == "/aenv/logs" and method == "GET":
            return await endpoints.get_logs(self.journal, req, send)
        raise HTTPError(404, f"no route for {method} {path}")
