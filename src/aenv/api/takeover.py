"""What a node does for a request its cluster's gateway moved or spread here (the cluster
token and a header say so)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from aenv.api.apierror import ApiError
from aenv.api.cluster_caller import from_cluster
from aenv.cluster import wire


def sharing_of(request: Request) -> Any:
    """The node's snapshot sharing (cluster/sharing.py); 404 on a node without one."""
    sharing = request.app.state.sharing
    if sharing is None:
        raise ApiError(404, "this node shares no snapshots")
    return sharing


async def take_over_if_moved(request: Request, sandbox_id: str) -> None:
    """A resume or connect a gateway moved here: the sandbox's published paused state
    becomes this node's first (cluster/takeover.py)."""
    if request.headers.get(wire.ADOPT_HEADER) and from_cluster(request):
        sharing = sharing_of(request)
        await sharing.takeover.adopt(sandbox_id)

