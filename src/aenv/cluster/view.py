"""A current, in-memory view of every key under an etcd prefix: one read, then a watch from
the revision it was read at; after a broken watch, a fresh read. Node records (gateways'
`Members`) and sandbox bindings (the gateway's routing table) are both kept this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from aenv.cluster.etcd import Etcd, EtcdError
from aenv.tasks import cancel

log = logging.getLogger("aenv.cluster")

RETRY_S = 1.0  # after a broken watch

T = TypeVar("T")


class PrefixView(Generic[T]):
    """`items`: the parsed value of every key under `prefix`, by the key's last part.
    Values `parse` rejects (None) are left out."""

    def __init__(self, etcd: Etcd, prefix: str, parse: Callable[[bytes], T | None]) -> None:
        self.etcd = etcd
        self.prefix = prefix
        self.parse = parse
        self.items: dict[str, T] = {}
        self.revision = 0
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()  # set on every change; whoever waits clears it

    async def start(self) -> None:
        """Read every key (EtcdError if etcd cannot be reached), then follow changes."""
        await self.load()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aenv-view")

    async def load(self) -> int:
        kvs, revision = await self.etcd.get_prefix(self.prefix)
        items = {}
        for kv in kvs:
            value = self.parse(kv.value)
            if value is not None:
                items[kv.key[len(self.prefix):]] = value
        self.items = items
        self.revision = revision
        self.changed.set()
        return revision

    async def _run(self) -> None:
        while True:
            try:
                async for ev in self.etcd.watch_prefix(self.prefix, self.revision + 1):
                    self.revision = max(self.revision, ev.kv.mod_revision)
                    name = ev.kv.key[len(self.prefix):]
                    if ev.type == "DELETE":
                        self.items.pop(name, None)
                    elif (value := self.parse(ev.kv.value)) is not None:
                        self.items[name] = value
                    else:
                        self.items.pop(name, None)
                    self.changed.set()
            except EtcdError as e:
                log.warning("watching %s: %s; reading again", self.prefix, e)
                await asyncio.sleep(RETRY_S)
                with contextlib.suppress(EtcdError):
                    await self.load()

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None
