"""Which node a request through the gateway goes to (cluster/gateway/routing.py)."""

from __future__ import annotations

import pytest

from aenv.cluster.gateway import routing


def _route(method: str, path: str) -> routing.Route:
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "headers": [(b"host", b"api.example.test")], "query_string": b""}  # fmt: skip
    return routing.route(scope, b"example.test")


@pytest.mark.parametrize(("method", "path", "want"), [
    ("POST", "/v3/templates", routing.ByTemplate(None)),
    ("GET", "/templates/t1/builds/b1/status", routing.ByTemplate(None)),
    ("POST", "/v2/templates/t1/builds/b1", routing.ByTemplate(None)),
    ("GET", "/templates/t1/files/abc", routing.ByTemplate(None)),
    ("GET", "/templates/my-tpl", routing.ByTemplate("my-tpl")),
    ("DELETE", "/templates/my-tpl", routing.ByTemplate("my-tpl")),
    ("GET", "/templates/aliases/my-tpl", routing.ByTemplate("my-tpl")),
    ("POST", "/snapshots/snap-1/fork", routing.ByTemplate("snap-1")),
    ("POST", "/sandboxes/abc/connect", routing.OneSandbox("abc", resume=True)),
    ("POST", "/sandboxes/abc/resume", routing.OneSandbox("abc", resume=True)),
    ("POST", "/sandboxes/abc/pause", routing.OneSandbox("abc")),
    ("GET", "/sandboxes/abc", routing.OneSandbox("abc")),
    ("POST", "/v2/sandboxes", routing.Create()),
    ("GET", "/snapshots", routing.Listing("snapshots")),
    ("GET", "/sandboxes/metrics", routing.Listing("metrics")),
    ("GET", "/sandboxes/abc/metrics", routing.OneSandbox("abc")),
])  # fmt: skip
def test_routes(method: str, path: str, want: routing.Route) -> None:
    assert _route(method, path) == want


@pytest.mark.parametrize(("method", "path", "want"), [
    ("POST", "/rl/groups", routing.RlHome()),
    ("GET", "/rl/groups/grp-1", routing.RlHome()),
    ("POST", "/rl/leases/lease-1", routing.RlHome()),
    ("POST", "/rl/run_code/sf1.k.mac", routing.RlHome()),
    ("POST", "/rl/evaluate", routing.RlHome()),
    ("POST", "/rl/sandboxes/abc/checkpoints", routing.OneSandbox("abc")),
    ("POST", "/rl/sandboxes/abc/rollback", routing.OneSandbox("abc")),
    ("POST", "/v2/sandboxes/abc/connect", routing.OneSandbox("abc", resume=True)),
])  # fmt: skip
def test_the_rl_plane_goes_home_but_a_sandboxs_calls_go_to_its_node(
        method: str, path: str, want: routing.Route) -> None:  # fmt: skip
    assert _route(method, path) == want
