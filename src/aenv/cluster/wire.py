"""What gateways and nodes say to each other beyond the E2B API: two headers on a create
the gateway placed, and the node's internal routes (`api/internal.py`), all authenticated
by the cluster token (`cluster.token`, shared by every node and gateway, never logged)."""

from __future__ import annotations

import hmac
import re

SANDBOX_ID_HEADER = "x-aenv-sandbox-id"  # the id the gateway bound before forwarding
TOKEN_HEADER = "x-aenv-cluster-token"
# With the id: answer with the sandbox this id made, never make it (an idempotent retry of
# a create that succeeded: the sandbox may have ended since).
EXISTING_HEADER = "x-aenv-existing-only"
# On a list answered to a gateway: each item's keyset cursor, comma-separated, so that the
# gateway can merge the nodes' pages in one order and hand out a cursor that stays stable.
CURSORS_HEADER = "x-aenv-cursors"
# On a resume or connect: the gateway moved this paused sandbox here (its node is lost or
# draining); the node takes its published paused state over first (cluster/takeover.py).
ADOPT_HEADER = "x-aenv-adopt"
INTERNAL_PREFIX = "/cluster/v1"
# The origin the client called, on requests a gateway forwards: URLs a node hands out
# (a build's upload URL) must point at the gateway, not at the node.
ORIGIN_HEADER = "x-aenv-client-origin"
SANDBOX_ID_RE = re.compile(r"^[a-z0-9]{1,64}$")


def token_ok(expected: str, given: str | None) -> bool:
    """A cluster request is one carrying the configured token; none is configured: none is."""
    return bool(expected) and given is not None and hmac.compare_digest(
        given.encode(), expected.encode())  # fmt: skip
