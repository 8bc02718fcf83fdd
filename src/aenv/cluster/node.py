"""A node's part in a cluster: what it publishes about itself, its registration, and the
bindings of its sandboxes (`bindings.py`).

Started by the node (`api/app.py`) when `cluster.etcd_endpoints` is set; a standalone node
never imports etcd at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

import aenv
from aenv.cluster.bindings import Held, NodeBindings
from aenv.cluster.etcd import Etcd, EtcdError
from aenv.cluster.forgetting import EVERY_S as FORGET_EVERY_S
from aenv.cluster.forgetting import Forgetting
from aenv.cluster.identity import node_name, node_url
from aenv.cluster.links import verify_for
from aenv.cluster.membership import Capacity, NodeRecord, Registration, Usage
from aenv.cluster.secrets import EtcdSecrets
from aenv.cluster.sharing import Sharing, shared_names
from aenv.cluster.team_holds import TeamHolds
from aenv.cluster.teams import EtcdTeams
from aenv.cluster.volumes import EtcdVolumes
from aenv.machines.hot import memory_budget_mib
from aenv.orchestrator.states import HOLDS_CAPACITY
from aenv.secrets.vault import Vault
from aenv.storage.kernel import kernel_cache_key
from aenv.storage.snapshots import SnapshotStore
from aenv.storage.tools import tools_key
from aenv.tasks import cancel
from aenv.teams.store import TeamStore
from aenv.volumes.store import VolumeStore

CLOSE_RECONCILE_S = 5.0
GUARD_EVERY_S = 0.2
STALL_S = 1.0  # a guard round this late is logged
FENCE_AT = 0.5  # of the lease's TTL without a renewal: fence, with half the TTL to pause
DRAIN_READ_EVERY_S = 1.0


class Drain(BaseModel):
    """`<prefix>drain/<node>`: written by `aenv node drain`, deleted by `undrain`."""

    pause: bool = False  # pause its running sandboxes, rather than let them finish
    at: float = 0.0


def drain_key(prefix: str, node: str) -> str:
    return f"{prefix}drain/{node}"

if TYPE_CHECKING:
    from aenv.config import Config
    from aenv.orchestrator.service import Orchestrator


class NodeMembership:
    """Builds this node's `NodeRecord` from its orchestrator and keeps it registered."""

    def __init__(self, cfg: Config, orchestrator: Orchestrator) -> None:
        self.cfg = cfg
        self.orch = orchestrator
        self.started_at = time.time()
        # Fixed for the process: the guest side it would build or restore with.
        self._kernel = kernel_cache_key()
        self._tools = tools_key()
        self.etcd = Etcd.of(cfg.cluster)
        self.registration = Registration(self.etcd, cfg.cluster.prefix, self.record,
                                         ttl_s=cfg.cluster.lease_ttl_s,
                                         renew_with=lambda: Etcd.of(cfg.cluster))  # fmt: skip
        self.bindings = NodeBindings(self.etcd, cfg.cluster.prefix, node_name(cfg), self.held,
                                     free=self._free, ended=self._ended)  # fmt: skip
        self._guard: asyncio.Task[None] | None = None
        self.forgetting = Forgetting(self.etcd, cfg.cluster.prefix,
                                     cfg.cluster.forget_lost_after_s)  # fmt: skip
        self._forget: asyncio.Task[None] | None = None
        self.teams: EtcdTeams | None = None  # from start()
        self.holds: TeamHolds | None = None  # from start()
        self.volumes: EtcdVolumes | None = None  # from start()
        # Snapshots shared with the other nodes (a runtime with a snapshot repository).
        self.sharing: Sharing | None = None
        if isinstance(getattr(orchestrator.runtime, "snapshots", None), SnapshotStore):
            self.sharing = Sharing(cfg, orchestrator, self.etcd, node_name(cfg))
            orchestrator.shared = self.sharing
            orchestrator.store.on_change.append(self.sharing.changed)
        orchestrator.on_stopped.append(self._last_reconcile)
        orchestrator.store.on_change.append(self.bindings.kick)

    def _ended(self, sandbox_id: str) -> bool:
        return self.orch.store.ended_team(sandbox_id) is not None

    def held(self) -> dict[str, Held]:
        return {r.sandbox_id: Held(r.memory_mib, r.template_id, r.state in HOLDS_CAPACITY,
                                   r.team_id)
                for r in self.orch.store.all()}  # fmt: skip

    def record(self) -> NodeRecord:
        orch, runtime = self.orch, self.orch.runtime
        hot = getattr(runtime, "hot", None)
        accel = getattr(runtime, "accel", None)
        budget = memory_budget_mib(self.cfg)
        templates = orch.templates(fetched=True)
        own = [t for t in templates if not t.fetched]
        snapshots = orch.snapshot_list()
        memory_of: dict[str, int] = {}
        for snap in snapshots:
            for name in (*snap.names, snap.snapshot_id):
                memory_of[name] = snap.shape.memory_mib
        for t in templates:  # a template's names win over a snapshot's (as in a create)
            for name in (*t.aliases, t.template_id):
                memory_of[name] = t.shape.memory_mib
        for ref, name in (orch.images.made() if orch.images is not None else {}).items():
            if name in memory_of:  # an image's creates are placed where its template is
                memory_of[ref] = memory_of[name]
        return NodeRecord(
            name=node_name(self.cfg), url=node_url(self.cfg), version=aenv.__version__,
            accelerator=accel() if callable(accel) else None,
            kernel=self._kernel, tools=self._tools,
            capacity=Capacity(max_sandboxes=self.cfg.max_sandboxes, budget_mib=budget,
                              memory_mib=int(budget * self.cfg.memory_overcommit)),
            usage=Usage(
                sandboxes=orch.store.count(HOLDS_CAPACITY),
                memory_mib=orch.store.sum_memory_mib(HOLDS_CAPACITY),
                hot_paused=len(hot.names()) if hot is not None else 0,
                hot_rss_mib=hot.resident_mib() if hot is not None else 0,
                held_mib=int(orch.memory.held_mib(0, 0)) if orch.memory.measured else 0,
            ),
            templates=sorted(t.template_id for t in own),
            snapshots=sorted(s.snapshot_id for s in snapshots),
            cached=self.sharing.cached() if self.sharing is not None else [],
            shared=shared_names(snapshots, own),
            memory_of=memory_of,
            draining=not orch.accepting, started_at=self.started_at,
        )  # fmt: skip

    async def start(self) -> None:
        # The cluster's secrets, which every node reads (cluster/secrets.py).
        # The cluster's secrets, which every node reads, under one key and one egress CA
        # (cluster/secrets.py).
        shared = EtcdSecrets(self.etcd, self.cfg.cluster.prefix, Vault(self.orch.secrets_key))
        await shared.join(self.orch.secrets_key, explicit=self.cfg.secrets_key_file is not None)
        # The node's own uses of the key (volumes' content tokens) are the cluster's too: a
        # token one node gave is taken at every other.
        assert shared.key is not None
        self.orch.secrets_key = shared.key
        runtime = self.orch.runtime
        if hasattr(runtime, "use_egress_ca"):
            explicit = self.cfg.network.ca_cert_file is not None
            runtime.use_egress_ca(*await shared.join_ca(*runtime.egress_ca, explicit))
        self.orch.secrets = shared
        # Teams and keys every node and gateway reads (cluster/teams.py).
        self.teams = EtcdTeams(self.etcd, self.cfg.cluster.prefix)
        await self.teams.start()
        local = self.orch.teams  # the node's own database's, which the cluster's replace
        if isinstance(local, TeamStore):
            clash = await self.teams.carry(local.teams(), local.keys(), local.key_hashes())
            if clash:
                logging.getLogger("aenv.cluster").warning(
                    "teams %s of this node's database were not carried into the cluster: "
                    "the cluster has teams of those names; their sandboxes here are no "
                    "team's of the cluster", clash)  # fmt: skip
        self.orch.teams = self.teams
        # Volumes every node knows, their data on the storage every node mounts.
        self.volumes = EtcdVolumes(self.etcd, self.cfg.cluster.prefix, self.cfg.volumes_dir,
                                   node_name(self.cfg), lambda: self.cfg.cluster.token,
                                   verify_for(self.cfg.cluster))  # fmt: skip
        await self.volumes.start()
        if isinstance(self.orch.volumes, VolumeStore):
            clash = await self.volumes.carry(self.orch.volumes.all())
            if clash:
                logging.getLogger("aenv.cluster").warning(
                    "volumes %s of this node's database were not carried into the cluster: "
                    "its teams have volumes of those names", clash)  # fmt: skip
        self.orch.volumes = self.volumes
        self.holds = TeamHolds(self.etcd, self.cfg.cluster.prefix, self.teams)
        self.orch.team_holds = self.holds
        await self.registration.start()
        await self.bindings.start()
        if self.sharing is not None:
            await self.sharing.start()
        self._guard = asyncio.get_running_loop().create_task(self._guarding(),
                                                             name="aenv-fence")  # fmt: skip
        self._forget = asyncio.get_running_loop().create_task(self._forgetting(),
                                                              name="aenv-forget")  # fmt: skip

    async def _forgetting(self) -> None:
        """Nodes that never come back are forgotten (cluster/forgetting.py)."""
        while True:
            await asyncio.sleep(FORGET_EVERY_S)
            try:
                await self.forgetting.round()
            except EtcdError as e:
                logging.getLogger("aenv.cluster").info("looking for nodes to forget: %s", e)

    async def _guarding(self) -> None:
        """Fencing, checked every GUARD_EVERY_S without a call to etcd (one that hangs
        must not delay it): the lease was last renewed more than FENCE_AT of its TTL ago
        (etcd out of reach), so the node stops serving sandbox traffic and pauses every
        sandbox while it still holds the lease; none runs here once the cluster may count
        this node lost and resume a sandbox elsewhere. Renewed again (or registered anew):
        its bindings are reconciled (what another node took over is freed here), then it
        serves again."""
        ttl = self.cfg.cluster.lease_ttl_s
        drain = asyncio.get_running_loop().create_task(self._draining(), name="aenv-drain")
        try:
            while True:
                slept = time.monotonic()
                await asyncio.sleep(GUARD_EVERY_S)
                if (late := time.monotonic() - slept - GUARD_EVERY_S) > STALL_S:
                    # What fences a loaded node may be its own event loop, not etcd.
                    logging.getLogger("aenv.cluster").warning("the event loop was held %.1f s",
                                                              late)
                held = time.monotonic() - self.registration.renewed_at
                if not self.orch.fenced and held > ttl * FENCE_AT:
                    await self.orch.fence()
                elif self.orch.fenced and held < ttl * FENCE_AT:
                    with contextlib.suppress(EtcdError):
                        while not await self.bindings.reconcile():
                            await asyncio.sleep(0.01)
                        self.orch.unfence()
        finally:
            await cancel(drain)

    async def _draining(self) -> None:
        """Drain (`aenv node drain`), read every DRAIN_READ_EVERY_S: `<prefix>drain/<node>`
        present: no new sandboxes here (and none placed), and with `pause` its running
        sandboxes are paused."""
        while True:
            await asyncio.sleep(DRAIN_READ_EVERY_S)
            if not self.orch.fenced:
                with contextlib.suppress(EtcdError):
                    await self._drain_step()

    async def _drain_step(self) -> None:
        kv = await self.etcd.get(drain_key(self.cfg.cluster.prefix, node_name(self.cfg)))
        order = None
        if kv is not None:
            try:
                order = Drain.model_validate_json(kv.value)
            except ValidationError:
                order = Drain()
        self.orch.set_draining(order is not None)
        if order is not None and order.pause:
            await self.orch.pause_all("drain")
        if order is not None:  # hot-paused VMMs hold memory a drained node gives back
            await self.orch.demote_hot("drain")

    async def _free(self, sandbox_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.orch.kill(sandbox_id)

    async def leave(self) -> None:
        """Shutdown begins: the record goes, so no gateway places here any more (and the
        lease no longer renewed is no reason to fence)."""
        await cancel(self._guard)
        await self.registration.stop()

    async def _last_reconcile(self) -> None:
        """The orchestrator stopped (its store still open): the bindings say what shutdown
        left, paused sandboxes bound to this node and holding nothing."""
        await self.bindings.stop()
        with contextlib.suppress(EtcdError, asyncio.TimeoutError):
            await asyncio.wait_for(self.bindings.reconcile(), CLOSE_RECONCILE_S)

    async def close(self) -> None:
        """After the orchestrator closed: etcd is let go."""
        try:
            await cancel(self._guard)
            await cancel(self._forget)
            await self.bindings.stop()
            if self.holds is not None:
                await self.holds.close()
            if self.teams is not None:
                await self.teams.stop()
            if self.volumes is not None:
                await self.volumes.stop()
            if self.sharing is not None:
                await self.sharing.close()
        finally:
            await self.registration.stop()
            await self.etcd.aclose()
