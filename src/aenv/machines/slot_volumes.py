"""The volume servers of the node's slots: one per slot whose guest mounts volumes, started
before its /init (which mounts them) and ended when the slot is given back."""

from __future__ import annotations

import asyncio
import logging

from aenv.config import Config
from aenv.machines.api import VolumeMount
from aenv.machines.machine import BootError
from aenv.network.slot import Slot
from aenv.volumes.server import Export, VolumeServer, VolumeServerError, export_path

log = logging.getLogger(__name__)


class SlotVolumes:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._servers: dict[int, VolumeServer] = {}  # by slot index

    async def serve(self, slot: Slot, mounts: list[VolumeMount]) -> list[dict[str, str]]:
        """The slot's server exporting `mounts` (started now unless it runs: a hot resume
        keeps it); returns /init's `aenvVolumes`. BootError if it does not start."""
        if slot.index not in self._servers:
            exports = list({m.name: Export(m.name, m.host_dir) for m in mounts}.values())
            server = VolumeServer(slot.netns_path, self.cfg.run_dir / "volumes"
                                  / f"{self.cfg.instance}-{slot.index}", exports)  # fmt: skip
            try:
                await server.start()
            except VolumeServerError as e:
                raise BootError(str(e)) from e
            self._servers[slot.index] = server
        return [{"source": export_path(m.name), "path": m.path} for m in mounts]

    async def unserve(self, slot: Slot) -> None:
        server = self._servers.pop(slot.index, None)
        if server is not None:
            await server.stop()

    def served(self) -> set[str]:
        """The state directory names (`<instance>-<slot>`) of the servers running now."""
        return {f"{self.cfg.instance}-{i}" for i in self._servers}

    async def close(self) -> None:
        await asyncio.gather(*(s.stop() for s in self._servers.values()))
        self._servers.clear()
