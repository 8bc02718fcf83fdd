"""The gateway's ASGI application: one origin for a cluster's whole E2B API.

    gw = Gateway(config)      # cluster.etcd_endpoints, cluster.token and the API key set
    uvicorn.run(gw, ...)      # lifespan: etcd, the node records and the bindings watched

Stateless: everything it knows is in etcd (node records, bindings) or asked of the nodes,
so any number of replicas serve the same cluster behind a load balancer. Each request
goes to one node, chosen by what it names (`routing.py`), and is relayed to it as is,
streaming both ways (`api/relay.py`, as the node's own proxy does). Sandbox traffic goes
with the E2B routing headers, so a node sees the same request whichever way the client
named the sandbox.

- A create is placed first: the gateway chooses the sandbox id, binds it to a node and
  reserves its capacity there in one etcd transaction (`placement.py`), then asks that
  node to create it under that id (with the cluster token). A create the node refuses,
  or that never reached it, gives its reservation back at once.
- A sandbox with no binding yet (a fork child, a create made on a node directly: the
  node binds them within a second) is looked for on every node (`/cluster/v1`), as is
  the sandbox a signed `/files` URL is for: tokens never leave their node.
- A sandbox whose node is not a member (lost, or gone) answers as a missing one does:
  404 on the control plane, 502 "was not found" on the data plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
from typing import Any

from pydantic import ValidationError

from aenv.api.console_cors import ConsoleCors
from aenv.api.lifespan import lifespan
from aenv.api.proxy import UNAUTHORIZED, Target, not_found_body
from aenv.api.relay import (
    Aborted,
    Exchange,
    Headers,
    deny,
    forward_headers,
    install_abort_filter,
    relay_http,
    relay_websocket,
    send_json,
    target_of,
)
from aenv.api.upstream import UpstreamPool
from aenv.cluster import placement, wire
from aenv.cluster.etcd import Etcd, EtcdError
from aenv.cluster.gateway import admin, callers, client, lists, orphans, routing, settings
from aenv.cluster.gateway.idempotency import HEADER as IDEMPOTENCY_HEADER
from aenv.cluster.gateway.idempotency import Claim, Idempotency, KeyReused
from aenv.cluster.gateway.nodes import (
    CREATE_TIMEOUT_S,
    Answer,
    NodeLinks,
    NodeUnreachable,
    call,
    call_all,
)
from aenv.cluster.gateway.rl_home import RlHome
from aenv.cluster.links import Links, TokenFile
from aenv.cluster.membership import Members, NodeRecord
from aenv.cluster.placement import (
    AlreadyBound,
    Binding,
    PlacementFailed,
    PlacementRequest,
    PreferLocal,
    TeamLimitReached,
    TeamQuota,
)
from aenv.cluster.published import (
    PublishedEntry,
    newest,
    parse_entry,
    paused_key,
    published_prefix,
)
from aenv.cluster.teams import EtcdTeams
from aenv.cluster.view import PrefixView
from aenv.config import Config
from aenv.obs import GATEWAY_REQUESTS
from aenv.orchestrator.requests import FULL_RETRY_AFTER_S

log = logging.getLogger("aenv.gateway")

MAX_CREATE_BODY = 1 << 20  # as a node's control plane (api/app.py)
FOUND_TTL_S = 10.0  # a sandbox found by asking the nodes: its binding comes within this
NOT_FOUND_TTL_S = 1.0  # a sandbox no node has: asked again after this
_SANDBOX_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_CONTROL_DROP = frozenset({
    b"host", b"expect", b"content-length", wire.SANDBOX_ID_HEADER.encode(),
    wire.TOKEN_HEADER.encode(), wire.ORIGIN_HEADER.encode(), wire.CURSORS_HEADER.encode(),
})  # fmt: skip
_DATA_DROP = _CONTROL_DROP | {
    b"e2b-sandbox-id", b"e2b-sandbox-port", b"x-agentenv-sandbox-id", b"x-agentenv-target-port",
}


def _parse_binding(raw: bytes) -> Binding | None:
    try:
        return Binding.model_validate_json(raw)
    except ValidationError:
        return None


class Gateway:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.prefix = config.cluster.prefix
        TokenFile(config.cluster).apply()  # a token kept in a file: read now, then watched
        self.domain = config.domain.lower().encode() if config.domain else None
        self.images = callers.ImageCreates(config.image_metadata_key,
                                           config.default_shape.memory_mib)  # fmt: skip
        self.pool = UpstreamPool()
        links = Links.of(config.cluster)
        self.links = NodeLinks(self.pool, links.client() if links is not None else None,
                               config.cluster.insecure_links)  # fmt: skip
        self._watches: list[asyncio.Task[None]] = []
        self.policy = PreferLocal()
        self.api_key = ""
        self.etcd: Etcd | None = None
        self.members: Members | None = None
        self.bindings: PrefixView[Binding] | None = None
        self.published: PrefixView[PublishedEntry] | None = None
        self.idem: Idempotency | None = None
        self.orphans = orphans.GatewayOrphans(self.links)  # creates nobody received
        # A burst's placements race for one reservation key per node: in turn, each wins its
        # first transaction (only other gateways' still race, placement.py).
        self._placing = asyncio.Lock()
        self.teams: EtcdTeams | None = None  # every team's keys (cluster/teams.py)
        self.rl_home: RlHome | None = None
        self._found: dict[str, tuple[str, float]] = {}  # sandbox id -> (node, until)
        self.cors = ConsoleCors([])  # the console's origins, once it serves one (server.py)
        self.admin = admin.NodesAdmin(self._etcd, self.prefix, self.links, self._nodes)
        install_abort_filter()

    # -- lifecycle -------------------------------------------------------------------------

    def check_config(self) -> None:
        """GatewayConfigError (one line) if it lacks what it needs to serve."""
        self.api_key = settings.check(self.config)

    async def start(self) -> None:
        cfg = self.config.cluster
        self.check_config()
        self.etcd = Etcd.of(cfg)
        self.members = Members(self.etcd, self.prefix)
        self.idem = Idempotency(self.etcd, self.prefix)
        self.bindings = PrefixView(self.etcd, f"{self.prefix}bindings/", _parse_binding)
        self.published = PrefixView(self.etcd, published_prefix(self.prefix), parse_entry)
        self.teams = EtcdTeams(self.etcd, self.prefix)
        self.rl_home = RlHome(self.etcd, self.prefix, self._nodes)
        try:
            await self.teams.start()
            await self.teams.bind_node_key(self.api_key)
            await self.members.start()
            await self.bindings.start()
            await self.published.start()
        except BaseException:
            await self.close()
            raise
        links = Links.of(cfg)
        if links is not None:  # replaced certificate files are taken (rotation)
            self._watches.append(asyncio.create_task(links.watch()))
        if cfg.token_file is not None:
            self._watches.append(asyncio.create_task(TokenFile(cfg).watch()))

    async def close(self) -> None:
        for w in self._watches:
            w.cancel()
        await self.orphans.close()
        for view in (self.published, self.bindings, self.members, self.teams):
            if view is not None:
                await view.stop()
        if self.etcd is not None:
            await self.etcd.aclose()
        await self.pool.aclose()

    # -- dispatch --------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind not in ("http", "websocket"):
            return
        if kind == "websocket":
            await receive()  # websocket.connect
        r = routing.route(scope, self.domain)
        send = await self.cors.around(scope, send, r.target.port
                                      if isinstance(r, routing.Data) else None)  # fmt: skip
        if send is None:  # a preflight of the console's, answered
            return
        label = type(r).__name__
        try:
            outcome = await self._dispatch(r, scope, receive, send)
        except EtcdError as e:
            outcome = "etcd_unavailable"
            await deny(scope, send, 503, {"code": 503, "message": f"cluster state is "
                                          f"unavailable: {e}"})  # fmt: skip
        GATEWAY_REQUESTS.labels(label, outcome).inc()

    async def _dispatch(self, r: routing.Route, scope: dict[str, Any], receive: Any,
                        send: Any) -> str:  # fmt: skip
        if isinstance(r, routing.Data):
            return await self._data(scope, receive, send, r.target)
        if scope["type"] == "websocket":
            await deny(scope, send, 404, {"code": 404, "message": "Not Found"})
            return "not_found"
        if isinstance(r, routing.OneSandbox):
            node = await self._owner(r.sandbox_id)
            headers = self._control_headers(scope)
            if r.resume:
                placed = await self._place_resume(send, r.sandbox_id, node,
                                                  callers.quota(self.teams, scope))
                if placed is False:
                    return "not_placed"
                if placed is not None and placed is not node:
                    node = placed
                    headers.append((wire.ADOPT_HEADER.encode(), b"1"))
            if node is None:
                await send_json(send, 404, _no_sandbox(r.sandbox_id))
                return "not_found"
            return await self._relay(scope, receive, send, node, headers)
        if isinstance(r, routing.Create):
            return await self._create(scope, receive, send)
        if isinstance(r, routing.Listing):
            return await self._listing(scope, send, r.kind)
        if isinstance(r, routing.Own):
            await admin.own(send, r.what, len(self._nodes()))
            return "ok"
        if isinstance(r, routing.NodesAdmin):
            return await self.admin.handle(scope, receive, send,
                                           callers.caller(self.teams, scope))  # fmt: skip
        node = (await self.rl_home.node() if isinstance(r, routing.RlHome) and self.rl_home
                else self._template_home(r.name if isinstance(r, routing.ByTemplate) else None))
        if node is None:
            await send_json(send, 503, _NO_NODES)
            return "no_nodes"
        return await self._relay(scope, receive, send, node, self._control_headers(scope))

    # -- where things are ------------------------------------------------------------------

    def _etcd(self) -> Etcd:
        assert self.etcd is not None  # between start and close
        return self.etcd

    def _nodes(self) -> list[NodeRecord]:
        assert self.members is not None
        return sorted(self.members.nodes.values(), key=lambda n: n.name)

    def _template_home(self, name: str | None) -> NodeRecord | None:
        nodes = self._nodes()
        if name:
            holding = [n for n in nodes if n.holds(name)]
            nodes = holding or nodes
        return nodes[0] if nodes else None

    async def _owner(self, sandbox_id: str) -> NodeRecord | None:
        """The member node that holds `sandbox_id`, or None (unknown, or its node lost)."""
        assert self.bindings is not None and self.members is not None and self.etcd
        if not _SANDBOX_ID.match(sandbox_id):
            return None  # no node made it: not worth a question to etcd or to the nodes
        b = self.bindings.items.get(sandbox_id)
        if b is None:  # the watch may lag a binding just written: etcd itself
            b = await placement.binding(self.etcd, self.prefix, sandbox_id)
        if b is not None:
            return self.members.nodes.get(b.node)
        found = self._found.get(sandbox_id)
        if found is not None and found[1] > time.monotonic():
            return self.members.nodes.get(found[0])
        target = f"{wire.INTERNAL_PREFIX}/sandboxes/{sandbox_id}".encode()
        for node, a in zip(nodes := self._nodes(),
                           await call_all(self.links, nodes, "GET", target, self._internal()),
                           strict=True):  # fmt: skip
            if isinstance(a, Answer) and a.status == 200:
                self._found[sandbox_id] = (node.name, time.monotonic() + FOUND_TTL_S)
                self._forget_found()
                return node
        # Nowhere: asked again only after a moment, so that a client polling a sandbox
        # that is gone does not ask every node on every request.
        self._found[sandbox_id] = ("", time.monotonic() + NOT_FOUND_TTL_S)
        self._forget_found()
        return None

    def _forget_found(self) -> None:
        if len(self._found) > 4096:
            now = time.monotonic()
            self._found = {k: v for k, v in self._found.items() if v[1] > now}

    async def _signed_owner(self, scope: dict[str, Any]) -> tuple[NodeRecord, str] | None:
        method = "POST" if scope.get("method") == "POST" else "GET"
        qs = scope.get("query_string", b"")
        target = f"{wire.INTERNAL_PREFIX}/signed-files?method={method}&".encode() + qs
        nodes = self._nodes()
        for node, a in zip(nodes, await call_all(self.links, nodes, "GET", target,
                                                 self._internal()), strict=True):  # fmt: skip
            if isinstance(a, Answer) and a.status == 200:
                return node, str(a.json()["sandboxID"])
        return None

    # -- headers ---------------------------------------------------------------------------

    def _internal(self) -> Headers:
        return [(wire.TOKEN_HEADER.encode(), self.config.cluster.token.encode())]

    def _control_headers(self, scope: dict[str, Any]) -> Headers:
        """The client's headers, and the cluster token with the origin the client called
        (for the URLs a node hands out). Never sent on sandbox traffic."""
        host = next((v for k, v in scope["headers"] if k == b"host"), b"")
        origin = f"{scope.get('scheme', 'http')}://".encode() + host
        return [*forward_headers(scope["headers"], _CONTROL_DROP), *self._internal(),
                (wire.ORIGIN_HEADER.encode(), origin)]  # fmt: skip

    # -- relaying --------------------------------------------------------------------------

    async def _data(self, scope: dict[str, Any], receive: Any, send: Any, t: Target) -> str:
        sid = t.sandbox_id
        if sid is None:
            found = await self._signed_owner(scope)
            if found is None:
                await deny(scope, send, 401, {"code": 401, "message": UNAUTHORIZED})
                return "unauthorized"
            node, sid = found
        else:
            owner = await self._owner(sid)
            if owner is None:
                await deny(scope, send, 502, not_found_body(sid))
                return "not_found"
            node = owner
        headers = [*forward_headers(scope["headers"], _DATA_DROP),
                   (b"e2b-sandbox-id", sid.encode()), (b"e2b-sandbox-port", b"%d" % t.port)]
        return await self._relay(scope, receive, send, node, headers, t.raw_path)

    async def _relay(self, scope: dict[str, Any], receive: Any, send: Any, node: NodeRecord,
                     headers: Headers, raw_path: bytes | None = None) -> str:  # fmt: skip
        path = raw_path if raw_path is not None else \
            scope.get("raw_path") or scope["path"].encode()
        target = target_of(scope, path)

        def unreachable() -> dict[str, Any]:
            return {"code": 502, "message": f"node {node.name} is unreachable"}

        try:
            host, port, tls = self.links.address(node.url)
        except ValueError as e:
            log.warning("node %s: %s", node.name, e)
            await deny(scope, send, 502, unreachable())
            return "node_unreachable"
        addr = (host, port)

        ex = Exchange()
        try:
            if scope["type"] == "websocket":
                return await relay_websocket(scope, receive, send, addr, target, headers, ex,
                                             unreachable, tls=tls)  # fmt: skip
            return await relay_http(self.pool, scope, receive, send, addr, target, headers, ex,
                                    unreachable, tls=tls)  # fmt: skip
        except asyncio.CancelledError:
            if not ex.taken_back():
                raise
            return "client_gone"
        except Aborted:
            GATEWAY_REQUESTS.labels("relay", "upstream_broken").inc()
            raise

    # -- create ----------------------------------------------------------------------------

    async def _create(self, scope: dict[str, Any], receive: Any, send: Any) -> str:
        if not self._key_ok(scope):
            await send_json(send, 401, {"code": 401, "message": "Invalid API key"})
            return "unauthorized"
        body = await client.read_body(receive, MAX_CREATE_BODY)
        if body is None:
            await send_json(send, 413, {"code": 413, "message": "request body too large "
                                        f"(limit {MAX_CREATE_BODY} bytes)"})  # fmt: skip
            return "too_big"
        watcher = client.watch(receive)
        try:
            return await self._create_read(scope, send, body, watcher)
        finally:
            watcher.cancel()

    async def _create_read(self, scope: dict[str, Any], send: Any, body: bytes,
                           watcher: asyncio.Task[Any]) -> str:  # fmt: skip
        nodes = self._nodes()
        if not nodes:
            await send_json(send, 503, _NO_NODES)
            return "no_nodes"
        target = target_of(scope, scope.get("raw_path") or scope["path"].encode())
        headers = self._control_headers(scope)
        assert self.published is not None
        req = callers.placement_request(body, nodes, list(self.published.items.values()),
                                        self.images)  # fmt: skip
        if req is None:  # not a create any node would make: its answer (400, 404) is ours
            return await self._answer(send, await call(self.links, nodes[0], "POST", target,
                                                       headers, body))  # fmt: skip
        req = dataclasses.replace(req, quota=callers.quota(self.teams, scope))
        claim: tuple[str, Claim] | None = None
        retried = False
        given = next((v for k, v in scope["headers"] if k == IDEMPOTENCY_HEADER), None)
        if given is not None:
            assert self.idem is not None
            caller = next(v for k, v in scope["headers"] if k == b"x-api-key")
            key = self.idem.key(caller.decode("latin-1"), given.decode("latin-1"))
            try:
                c, first = await self.idem.claim(key, body)
            except KeyReused as e:
                await send_json(send, 409, {"code": 409, "message": str(e)})
                return "key_reused"
            claim, retried = (key, c), not first
            req = dataclasses.replace(req, sandbox_id=c.sandbox_id)
        node = await self._place(send, req, nodes, claim)
        if node is None:
            return "not_placed"
        if client.has_left(watcher):  # it left while placements queued: make nothing
            await self._give_back(req.sandbox_id, claim)
            return "client_gone"
        headers.append((wire.SANDBOX_ID_HEADER.encode(), req.sandbox_id.encode()))
        if claim is not None and claim[1].done:
            headers.append((wire.EXISTING_HEADER.encode(), b"1"))
        try:
            answer = await call(self.links, node, "POST", target, headers, body,
                                timeout_s=CREATE_TIMEOUT_S)  # fmt: skip
        except NodeUnreachable as e:
            if not e.connected:  # it never got there: nothing to wait for
                await self._give_back(req.sandbox_id, claim)
            # Else it may have been made: the node binds it, or drops the pending binding;
            # a retry with the key gets the sandbox the id made.
            await send_json(send, 502, {"code": 502, "message": str(e)})
            return "node_unreachable"
        if answer.status >= 300 and not (claim is not None and claim[1].done):
            await self._give_back(req.sandbox_id, claim)
            return await self._answer(send, answer)
        if claim is not None and not retried:
            assert self.idem is not None
            with contextlib.suppress(EtcdError):  # before the look at the client: no etcd
                await self.idem.done(*claim)  # call between that look and the answer
        left = client.has_left(watcher)  # then nobody will learn its id
        if claim is not None and retried:
            assert self.idem is not None
            with contextlib.suppress(EtcdError):
                await (self.idem.done if left else self.idem.received)(*claim)
        if left:
            self.orphans.left(node, req.sandbox_id, self._control_headers(scope),
                              claim and (self.idem, claim[0]))  # fmt: skip
            return "client_gone"
        return await self._answer(send, answer)

    async def _place(self, send: Any, req: PlacementRequest, nodes: list[NodeRecord],
                     claim: tuple[str, Claim] | None) -> NodeRecord | None:  # fmt: skip
        """The node `req` goes to: placed now, or (a retry with an idempotency key) where
        an earlier try placed it. None once an error is sent."""
        assert self.etcd is not None and self.members is not None
        # A template or snapshot any node may fetch (a peer shares it as its own, or the
        # store has it) may go to any node (holders first: the policy prefers them).
        assert self.published is not None
        fetchable = any(req.template in n.shared for n in nodes) or newest(
            list(self.published.items.values()), req.template) is not None
        holders = [] if fetchable else [n for n in nodes if n.holds(req.template)]
        for _ in range(2):
            if claim is not None:
                b = await placement.binding(self.etcd, self.prefix, req.sandbox_id)
                if b is not None:
                    node = self.members.nodes.get(b.node)
                    if node is None:
                        assert self.idem is not None
                        await self.idem.let_go(*claim)
                        await send_json(send, 502, {"code": 502, "message": (
                            f"the node of this create ({b.node}) is lost; retry to create "
                            "anew")})  # fmt: skip
                    return node
                if claim[1].done:
                    await send_json(send, 409, {"code": 409, "message": (
                        f"the sandbox this create made ({req.sandbox_id}) no longer "
                        "exists")})  # fmt: skip
                    return None
            try:
                async with self._placing:  # this gateway's placements one at a time
                    return await placement.place(self.etcd, self.prefix, holders or nodes,
                                                 req, self.policy)  # fmt: skip
            except PlacementFailed as e:
                await send_json(send, 429, {"code": 429, "message": str(e)},
                                [(b"retry-after", str(FULL_RETRY_AFTER_S).encode())])
                return None
            except TeamLimitReached as e:  # as a node says it (api/errors.py): do not retry
                if claim is not None and self.idem is not None:
                    with contextlib.suppress(EtcdError):
                        await self.idem.let_go(*claim)
                await send_json(send, 429, {"code": 429, "message": str(e)},
                                [(b"should-retry", b"false")])
                return None
            except AlreadyBound:  # another try of the same key placed it meanwhile
                if claim is None:
                    raise
        raise EtcdError(f"sandbox {req.sandbox_id}: placed and unplaced at once")

    async def _place_resume(self, send: Any, sandbox_id: str, node: NodeRecord | None,
                            quota: TeamQuota | None) -> NodeRecord | None | bool:  # fmt: skip
        """A resume or connect of a paused sandbox, placed as a create is (one etcd
        transaction): on its own node if that one serves and its team has limits (so they
        hold across the cluster), else, its node lost or draining and its paused state
        published, on another node, which takes it over. The node to send it to (None: no
        placement, send it where it is); False once an error is sent."""
        assert self.etcd is not None and self.members is not None
        serving = node is not None and not node.draining
        if serving and (quota is None or not quota.limited):
            return None  # its node admits it, as it would alone
        bkv = await self.etcd.get(placement.binding_key(self.prefix, sandbox_id))
        old = _parse_binding(bkv.value) if bkv is not None else None
        if old is None and serving:
            return None
        if old is not None and old.holds:
            return None  # it runs (or starts) somewhere: nothing to place
        if serving:
            assert node is not None and old is not None
            nodes, memory = [node], old.memory_mib
        else:
            entry = parse_entry(kv.value) if (kv := await self.etcd.get(
                paused_key(self.prefix, sandbox_id))) is not None else None  # fmt: skip
            if entry is None:
                return None
            nodes = [n for n in self._nodes() if old is None or n.name != old.node]
            memory = entry.memory_mib
            if old is not None:  # its binding says whose it is
                quota = callers.team_quota(self.teams, old.team)
        req = PlacementRequest(sandbox_id=sandbox_id, memory_mib=memory, quota=quota)
        try:
            return await placement.place(self.etcd, self.prefix, nodes, req, self.policy,
                                         replacing=bkv.mod_revision if bkv else 0)  # fmt: skip
        except TeamLimitReached as e:
            await send_json(send, 429, {"code": 429, "message": str(e)},
                            [(b"should-retry", b"false")])
            return False
        except PlacementFailed as e:
            if nodes == [node]:
                return None  # its own node is full: that node answers, as it would alone
            await send_json(send, 429, {"code": 429, "message": str(e)},
                            [(b"retry-after", str(FULL_RETRY_AFTER_S).encode())])
            return False
        except AlreadyBound:  # another gateway placed it meanwhile: where to, it says
            b = await placement.binding(self.etcd, self.prefix, sandbox_id)
            return self.members.nodes.get(b.node) if b is not None else None

    async def _give_back(self, sandbox_id: str, claim: tuple[str, Claim] | None) -> None:
        """A create that failed: its reservation, and its idempotency key (a retry is then a
        new attempt)."""
        assert self.etcd is not None
        await _release(self.etcd, self.prefix, sandbox_id)
        if claim is not None and self.idem is not None:
            with contextlib.suppress(EtcdError):
                await self.idem.let_go(*claim)

    def _key_ok(self, scope: dict[str, Any]) -> bool:
        """A key of a team (the cluster's own key is the default team's admin key); the
        nodes then scope what the call sees to that team."""
        return callers.caller(self.teams, scope) is not None

    async def _answer(self, send: Any, a: Answer) -> str:
        headers = [(k, v) for k, v in a.headers if k.lower() not in _ANSWER_DROP]
        headers.append((b"content-length", str(len(a.body)).encode()))
        await send({"type": "http.response.start", "status": a.status, "headers": headers})
        await send({"type": "http.response.body", "body": a.body})
        return "ok" if a.status < 400 else f"status_{a.status}"

    # -- listings and its own ----------------------------------------------------------------

    async def _listing(self, scope: dict[str, Any], send: Any, kind: str) -> str:
        if not self._key_ok(scope):
            await send_json(send, 401, {"code": 401, "message": "Invalid API key"})
            return "unauthorized"
        return await lists.answer(self.links, self._nodes(), kind, scope, send,
                                  self._control_headers(scope))  # fmt: skip

    async def _lifespan(self, receive: Any, send: Any) -> None:
        await lifespan(receive, send, self.start, self.close, "gateway")


_ANSWER_DROP = frozenset({b"content-length", b"transfer-encoding", b"connection",
                          b"keep-alive", b"date", b"server"})  # fmt: skip


def _no_sandbox(sandbox_id: str) -> dict[str, Any]:
    return {"code": 404,
            "message": f'sandbox "{sandbox_id}" doesn\'t exist or you don\'t have access to it'}


_NO_NODES = {"code": 503, "message": "no node of the cluster is available"}


async def _release(etcd: Etcd, prefix: str, sandbox_id: str) -> None:
    try:
        await placement.release(etcd, prefix, sandbox_id)
    except (EtcdError, PlacementFailed) as e:  # the node's reconcile drops it in the end
        log.warning("releasing %s: %s", sandbox_id, e)
