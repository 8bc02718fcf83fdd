"""The node's ASGI application: the data-plane proxy in front of the FastAPI control plane.

    node = Node(config)            # or Node(config, runtime=FakeRuntime()) in tests
    uvicorn.run(node, ...)         # lifespan starts/stops the orchestrator

A request that names a sandbox (see `proxy.py`) never reaches FastAPI's routing; everything
else is the control plane, whose bodies are capped at `MAX_CONTROL_BODY` bytes (413 beyond).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

import aenv
from aenv.api import (
    builds,
    dockerfile_builds,
    errors,
    internal,
    links,
    logs,
    metrics,
    overview,
    rl,
    sandboxes,
    secrets,
    snapshots,
    system,
    teams,
    templates,
    uploads,
    volumes,
)
from aenv.api.auth import resolve_api_key
from aenv.api.console_cors import ConsoleCors
from aenv.api.lifespan import lifespan
from aenv.api.proxy import DataPlaneProxy
from aenv.api.relay import send_json
from aenv.cluster.links import TokenFile, link_port
from aenv.config import Config
from aenv.images import bases
from aenv.images.builds import Builds
from aenv.images.context import ContextStore
from aenv.images.on_demand import OnDemandImages
from aenv.machines.api import Runtime
from aenv.orchestrator.factory import make_runtime
from aenv.orchestrator.history import History
from aenv.orchestrator.pending import PendingTemplates
from aenv.orchestrator.service import Orchestrator
from aenv.origins import console_origins
from aenv.rl.server.service import RL
from aenv.teams.model import TeamNotFound

if TYPE_CHECKING:
    from aenv.cluster.node import NodeMembership

log = logging.getLogger("aenv.api")

# Control-plane request bodies are small JSON; anything bigger is refused with 413.
MAX_CONTROL_BODY = 1 << 20
OPENAPI_PATH = "/openapi.json"


def build_api(node: Node) -> FastAPI:
    api = FastAPI(
        title="aenv",
        version=aenv.__version__,
        description="E2B-compatible control plane of one aenv node (see docs/api.md).",
        openapi_url=OPENAPI_PATH,
        docs_url=None,
        redoc_url=None,
    )
    api.state.orchestrator = node.orchestrator
    api.state.api_key = node.api_key
    api.state.domain = node.config.domain or None
    api.state.builds = node.builds
    api.state.images = node.images
    # The token it takes (and, during a rotation, the others): read at each call, since a
    # token file changes them in place (cluster/links.py, TokenFile).
    api.state.cluster = node.config.cluster
    # Where the cluster's links use TLS, the token counts only on the cluster listener.
    api.state.link_port = link_port(node.config) if node.config.cluster.link_tls else 0
    api.state.proxy = node.proxy
    api.state.sharing = None  # the cluster's snapshot sharing, once the node has joined
    api.state.rl = node.rl
    api.state.history = node.history
    errors.install(api)
    api.include_router(system.router)
    api.include_router(internal.router)
    api.include_router(metrics.router)  # before /sandboxes/{id}: /sandboxes/metrics
    api.include_router(logs.router)
    api.include_router(sandboxes.router)
    api.include_router(builds.router)  # before the catch-all /templates/{id:path} routes
    api.include_router(dockerfile_builds.router)
    api.include_router(snapshots.router)
    api.include_router(templates.router)
    api.include_router(secrets.router)
    api.include_router(volumes.router)
    api.include_router(volumes.content)
    api.include_router(teams.router)
    api.include_router(overview.router)
    api.include_router(rl.router)
    api.include_router(rl.public)
    api.openapi = lambda: _openapi(api)  # type: ignore[method-assign]
    return api


def _openapi(api: FastAPI) -> dict[str, Any]:
    """FastAPI's document, minus its 422s: validation errors are E2B's 400 `Error` here."""
    if api.openapi_schema is None:
        doc = get_openapi(title=api.title, version=api.version, description=api.description,
                          routes=api.routes)  # fmt: skip
        for ops in doc.get("paths", {}).values():
            for op in ops.values():
                op.get("responses", {}).pop("422", None)
        schemas = doc.get("components", {}).get("schemas", {})
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        links.add_links(doc)
        api.openapi_schema = doc
    return api.openapi_schema


class Node:
    """One node: orchestrator + proxy + control plane. Valid between start() and close()."""

    def __init__(self, config: Config, runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = runtime if runtime is not None else make_runtime(config)
        self.api_key = resolve_api_key(config)
        self.orchestrator = Orchestrator(config, self.runtime)
        self.proxy = DataPlaneProxy(self.orchestrator.routes, config.domain,
                                    resolve=self.orchestrator.route_for_paused)  # fmt: skip
        # The console calls from its own origin (origins.py): CORS for it alone.
        self.console_cors = ConsoleCors(console_origins(config), self.proxy.agent_port)
        self.builds = _builds(config, self.runtime, self.orchestrator.pending)
        # Sandboxes from image references (images/on_demand.py): a node that builds pulls.
        self.images = (OnDemandImages(config, self.runtime, self.orchestrator.pending,
                                      self._team_registries)
                       if self.builds is not None else None)  # fmt: skip
        self.orchestrator.images = self.images
        self.rl = RL(self.orchestrator)  # groups, leases, evaluations (rl/server/)
        # The last hour of what teams hold, for the console's overview (GET /overview).
        self.history = History(self.orchestrator.store, self.runtime.tier,
                               config.overview_sample_s)  # fmt: skip
        self._history_task: asyncio.Task[None] | None = None
        # The node's own `base`, made while it serves if it has none (images/bases.py).
        self.base = (bases.InBackground(self.runtime, self.orchestrator.pending)
                     if self.builds is not None else None)  # fmt: skip
        self.api = build_api(self)
        self._health = _HEALTH
        self._started = False
        self.membership: NodeMembership | None = None
        # A cluster token kept in a file: read now, watched while the node runs (links.py).
        self.token_file = TokenFile(config.cluster)
        self.token_file.apply()
        self._token_watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.orchestrator.start()
        if self.config.cluster.etcd_endpoints:
            from aenv.cluster.node import NodeMembership  # a standalone node needs no etcd

            self.membership = NodeMembership(self.config, self.orchestrator)
            try:
                await self.membership.start()
            except BaseException:
                await self.membership.close()
                await self.orchestrator.close()
                raise
            self.api.state.sharing = self.membership.sharing
            if self.config.cluster.token_file is not None:
                self._token_watch = asyncio.create_task(self.token_file.watch())
        # The node's own key: its (or its cluster's, once joined) default team's admin key.
        assert self.orchestrator.teams is not None
        await self.orchestrator.teams.bind_node_key(self.api_key)
        # Node info rides on /health: the accelerator the runtime detected (kvm or tcg).
        accel = getattr(self.orchestrator.runtime, "accel", None)
        self._health = json.dumps(
            {"status": "ok", "version": aenv.__version__,
             "accelerator": accel() if callable(accel) else None},
            separators=(",", ":")).encode()
        await self.rl.start()
        self._history_task = asyncio.create_task(self.history.run(), name="aenv-history")
        self._started = True
        if self.base is not None:
            self.base.start()

    def begin_shutdown(self) -> None:
        self.orchestrator.begin_shutdown()

    def _team_registries(self, team_id: str) -> tuple[str, ...] | None:
        """A team's own `imageRegistries` (None: the node's image_registries apply)."""
        teams = self.orchestrator.teams
        try:
            return teams.team(team_id).image_registries if teams is not None else None
        except TeamNotFound:
            return None

    async def close(self) -> None:
        if self._token_watch is not None:
            self._token_watch.cancel()
        if self._history_task is not None:
            self._history_task.cancel()
        try:
            if self.membership is not None:  # leave the cluster first: no new placements
                await self.membership.leave()
            if self.base is not None:
                await self.base.close()
            if self.images is not None:
                await self.images.close()
            if self.builds is not None:
                await self.builds.close()  # their VMs go before the runtime does
            await self.rl.close()  # groups end: their start states are deleted
            await self.orchestrator.close()
        finally:
            try:
                if self.membership is not None:
                    await self.membership.close()
            finally:
                await self.proxy.aclose()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http" or kind == "websocket":
            target = self.proxy.match(scope)
            send = await self.console_cors.around(scope, send, target and target.port)
            if send is None:  # a preflight of the console's, answered
                return
            if target is not None:
                await self.proxy.handle(scope, receive, send, target)
            elif uploads.is_upload(scope):
                await uploads.handle(self.builds and self.builds.contexts, scope, receive, send)
            elif kind == "http" and scope["path"] == "/health" and scope["method"] == "GET":
                await _send_bytes(send, 200, self._health)  # hot path: load balancers poll it
            elif kind == "http" and scope["path"].startswith(volumes.CONTENT_PREFIX):
                await self.api(scope, receive, send)  # file bodies: streamed, not capped
            elif kind == "http":
                await self._control(scope, receive, send)
            else:
                await self.api(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _control(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        length = None
        chunked = False
        json_body = False
        for k, v in scope["headers"]:
            if k == b"content-length":
                length = v
            elif k == b"transfer-encoding":
                chunked = True
            elif k == b"content-type":
                json_body = b"json" in v
        if not json_body and (chunked or length not in (None, b"0")):
            # Every control-plane body is JSON, whatever the client labelled it (curl -d).
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope["headers"].append((b"content-type", b"application/json"))
        if length is not None:
            try:
                too_big = int(length) > MAX_CONTROL_BODY
            except ValueError:
                await send_json(send, 400, errors.body(400, "invalid Content-Length"))
                return
            if too_big:
                await send_json(send, 413, errors.body(413, _too_big()))
                return
        elif chunked:
            data = bytearray()
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                data += msg.get("body", b"")
                if len(data) > MAX_CONTROL_BODY:
                    await send_json(send, 413, errors.body(413, _too_big()))
                    return
                if not msg.get("more_body", False):
                    break
            receive = _replay(bytes(data), receive)
        await self.api(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        await lifespan(receive, send, self.start, self.close, "node")


_HEALTH = b'{"status":"ok"}'


def _builds(config: Config, runtime: Runtime, pending: PendingTemplates) -> Builds | None:
    """Template builds need build VMs: the real runtime only (not the fake one)."""
    if not hasattr(runtime, "snapshot_build"):
        return None
    contexts = ContextStore(config.images_dir / "contexts", config.build_context_max_bytes)
    return Builds(config, runtime, contexts, pending)


async def _send_bytes(send: Any, status: int, body: bytes) -> None:
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def _too_big() -> str:
    return f"request body too large (limit {MAX_CONTROL_BODY} bytes)"


def _replay(data: bytes, receive: Any) -> Any:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        return await receive()

    return replay


def create_app(config: Config, runtime: Runtime | None = None) -> Node:
    return Node(config, runtime)
