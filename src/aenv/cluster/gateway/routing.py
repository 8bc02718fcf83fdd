"""Which node a request through the gateway goes to is decided by what it names.

In this order:
1. a sandbox's data plane (header, `/proxy/<id>/<port>/`, `<port>-<id>.<domain>`, or a
   signed `/files` URL): the node its binding names (`api/proxy.py` has the rules);
2. `/sandboxes/<id>…` and `/v2/sandboxes/<id>…`: likewise;
3. `POST /sandboxes` and `POST /v2/sandboxes`: a create, placed (`placement.py`);
4. `GET /sandboxes`, `GET /v2/sandboxes`, `GET /snapshots`, `GET /templates`,
   `GET /sandboxes/metrics` (of several sandboxes) and `GET /overview`: every node, merged
   (`lists.py`, `overview.py`);
5. a template or snapshot by name (`/templates/<name>…`, `/snapshots/<id>/fork`): a node
   that holds it; a build (`POST /v3/templates`, and every `…/builds…` and `…/files…`
   call of one) and the template tags: the cluster's first node (by name), whichever
   node holds an older version, so all the calls of one build reach the node running it
   (the template it makes is then fetched by the nodes creates from it go to);
6. `/health` and `/metrics`: the gateway's own;
7. the RL plane (`/rl/...`): the cluster's RL home (`rl_home.py`), but a call naming a
   sandbox (`/rl/sandboxes/<id>/...`): the sandbox's node, as 2;
8. the cluster's nodes (`/admin/nodes...`, admin keys): the gateway's own (`admin.py`);
9. anything else: the first node (whose answer is then the cluster's: a 404, openapi).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from aenv.api.proxy import Target, match_target
from aenv.cluster.gateway.admin import is_nodes_admin

_SANDBOX = re.compile(r"^/(?:v2/)?sandboxes/([^/]+)(?:/.*)?$")
_TEMPLATE = re.compile(r"^/(?:v2/)?templates/(.+?)(?:/(?:builds|files|tags)(?:/.*)?)?$")
_BUILD = re.compile(r"^/(?:v2/)?templates/[^/]+/(?:builds|files)(?:/.*)?$")
_RESUMES = ("/resume", "/connect")
_SNAPSHOT_FORK = re.compile(r"^/snapshots/([^/]+)/fork$")
_RL_SANDBOX = re.compile(r"^/rl/sandboxes/([^/]+)(?:/.*)?$")


@dataclass(frozen=True, slots=True)
class Data:
    target: Target  # its sandbox_id is None for a signed /files URL


@dataclass(frozen=True, slots=True)
class OneSandbox:
    sandbox_id: str
    resume: bool = False  # a resume or connect: a paused sandbox may move to another node


@dataclass(frozen=True, slots=True)
class Create:
    pass


ListingKind = Literal["sandboxes", "sandboxes_v2", "snapshots", "templates", "metrics",
                      "overview"]


@dataclass(frozen=True, slots=True)
class Listing:
    kind: ListingKind


@dataclass(frozen=True, slots=True)
class ByTemplate:
    name: str | None  # None: a build of a new template, tags: the first node


@dataclass(frozen=True, slots=True)
class Own:
    what: Literal["health", "metrics"]


@dataclass(frozen=True, slots=True)
class RlHome:
    pass


@dataclass(frozen=True, slots=True)
class NodesAdmin:
    pass


@dataclass(frozen=True, slots=True)
class AnyNode:
    pass


Route = Data | OneSandbox | Create | Listing | ByTemplate | Own | RlHome | NodesAdmin | AnyNode

_LISTINGS: dict[str, ListingKind] = {
    "/sandboxes": "sandboxes", "/v2/sandboxes": "sandboxes_v2", "/snapshots": "snapshots",
    "/templates": "templates", "/sandboxes/metrics": "metrics", "/overview": "overview",
}  # fmt: skip


def route(scope: dict[str, Any], domain: bytes | None) -> Route:
    target = match_target(scope, domain)
    if target is not None:
        return Data(target)
    path: str = scope["path"]
    method = scope.get("method", "GET")
    if method == "GET" and path in _LISTINGS:
        return Listing(_LISTINGS[path])
    if method == "POST" and path in ("/sandboxes", "/v2/sandboxes"):
        return Create()
    if m := _SANDBOX.match(path):
        return OneSandbox(m.group(1), method == "POST" and path.endswith(_RESUMES))
    if m := _RL_SANDBOX.match(path):
        return OneSandbox(m.group(1))
    if path.startswith("/rl/"):
        return RlHome()
    if is_nodes_admin(path):
        return NodesAdmin()
    if path in ("/health", "/metrics") and method == "GET":
        return Own("health" if path == "/health" else "metrics")
    if m := _SNAPSHOT_FORK.match(path):
        return ByTemplate(m.group(1))
    if path == "/v3/templates" or path.startswith("/templates/tags") or \
            path.startswith("/upload"):
        return ByTemplate(None)
    if path.startswith("/templates/aliases/"):
        return ByTemplate(path[len("/templates/aliases/"):])
    if _BUILD.match(path):  # a build's calls all go where builds run, whoever holds it now
        return ByTemplate(None)
    if m := _TEMPLATE.match(path):
        return ByTemplate(m.group(1))
    return AnyNode()
