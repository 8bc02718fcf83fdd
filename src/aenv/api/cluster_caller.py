"""Whether a request comes from the node's cluster (a gateway or a peer node)."""

from __future__ import annotations

from starlette.requests import Request

from aenv.cluster import wire


def from_cluster(request: Request) -> bool:
    """It carries the cluster token, and where the cluster's links use TLS it came over the
    cluster listener, whose every caller showed a certificate of the cluster's CA: a
    leaked token alone, sent to the public port, is nobody's (cluster/links.py)."""
    state = request.app.state
    if state.link_port and (request.scope.get("server") or ("", 0))[1] != state.link_port:
        return False
    given = request.headers.get(wire.TOKEN_HEADER)
    return any(wire.token_ok(t, given) for t in state.cluster.tokens_taken())
