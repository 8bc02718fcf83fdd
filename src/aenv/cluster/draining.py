"""Draining a node: `<prefix>drain/<node>` written (placements and creates stop there; with
`pause`, its running sandboxes pause) or deleted. One place for `aenv node drain|undrain` and
the gateway's admin routes (the console's nodes page)."""

from __future__ import annotations

import time

from aenv.cluster.etcd import Etcd
from aenv.cluster.membership import Members
from aenv.cluster.node import Drain, drain_key


async def drain(etcd: Etcd, prefix: str, name: str, pause: bool) -> bool:
    """False if no node `name` is registered."""
    members = Members(etcd, prefix)
    await members.load()
    if name not in members.nodes:
        return False
    await etcd.put(drain_key(prefix, name), Drain(pause=pause, at=time.time()).model_dump_json())
    return True


async def undrain(etcd: Etcd, prefix: str, name: str) -> bool:
    """False if node `name` was not draining."""
    return bool(await etcd.delete(drain_key(prefix, name)))
