"""A cluster's volumes: their records in its etcd, so every node and gateway knows them, and
their data in `volumes_path`, which every node mounts from one shared filesystem
(docs/cluster.md, "Volumes"). A sandbox resumed or forked on another node mounts the same
volume there, from the same directory; the content API answers at any node.

    <prefix>volumes/id/<volume id>            {"name", "team", "created_us"}
    <prefix>volumes/name/<team>/<name>        <volume id>: a name is taken once per team

Reads come from a view kept by etcd's watch (a miss asks etcd: the watch may lag a volume
just made elsewhere); a create or delete is one transaction over both keys. Content tokens
are HMACs under the secrets key every node of a cluster shares (volumes/store.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from aenv.cluster import wire
from aenv.cluster.etcd import Etcd, compare_mod, compare_version, delete_op, put_op
from aenv.cluster.membership import others
from aenv.cluster.view import PrefixView
from aenv.volumes.store import (
    DEFAULT_GID,
    DEFAULT_UID,
    ID_PREFIX,
    VolumeExists,
    VolumeInfo,
    VolumeInUse,
    VolumeNotFound,
    check_name,
)

ASK_TIMEOUT_S = 10.0


def _doc(raw: bytes) -> dict[str, Any] | None:
    try:
        d = json.loads(raw)
    except ValueError:
        return None
    return d if isinstance(d, dict) and isinstance(d.get("name"), str) else None


class EtcdVolumes:
    def __init__(self, etcd: Etcd, prefix: str, root: Path, node: str = "",
                 token: Callable[[], str] = str, verify: ssl.SSLContext | bool = True,
                 ) -> None:  # fmt: skip
        """`node`, `token`, `verify`: this node's name, the cluster token (read at each call:
        a token file changes it) and the links' TLS, to ask the others which of their
        sandboxes mount a volume (`users_elsewhere`)."""
        self._etcd = etcd
        self._verify = verify
        self._prefix, self._node, self._token = prefix, node, token
        self._p = f"{prefix}volumes/"
        self._view: PrefixView[dict[str, Any]] = PrefixView(etcd, self._p + "id/", _doc)
        self.root = root

    async def start(self) -> None:
        await self._view.start()

    async def stop(self) -> None:
        await self._view.stop()

    def _name_key(self, team_id: str, name: str) -> str:
        return f"{self._p}name/{team_id}/{name}"

    def _info(self, vid: str, d: dict[str, Any]) -> VolumeInfo:
        return VolumeInfo(vid, d["name"], int(d.get("created_us", 0)))

    async def create(self, name: object, team_id: str) -> VolumeInfo:
        name = check_name(name)
        vid = ID_PREFIX + secrets.token_hex(10)
        doc = {"name": name, "team": team_id, "created_us": time.time_ns() // 1000}
        path = self.root / vid
        self.root.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o755)
        os.chown(path, DEFAULT_UID, DEFAULT_GID)
        nkey = self._name_key(team_id, name)
        r = await self._etcd.txn([compare_version(nkey, "EQUAL", 0)],
                                 [put_op(nkey, vid),
                                  put_op(self._p + "id/" + vid, json.dumps(doc))])
        if not r.succeeded:
            path.rmdir()
            raise VolumeExists(f"a volume named {name!r} exists")
        self._view.items[vid] = doc  # seen here at once; the watch brings the same
        return self._info(vid, doc)

    async def _doc_of(self, vid: str) -> dict[str, Any] | None:
        d = self._view.items.get(vid)
        if d is None and (kv := await self._etcd.get(self._p + "id/" + vid)) is not None:
            d = _doc(kv.value)
        return d

    async def get(self, ref: str, team_id: str | None) -> VolumeInfo:
        """The team's volume by id or by name; with no team (the content API), by id."""
        vid: str | None = ref
        if team_id is not None and not ref.startswith(ID_PREFIX):
            vid = next((v for v, d in self._view.items.items()
                        if d.get("team") == team_id and d["name"] == ref), None)  # fmt: skip
            if vid is None and (kv := await self._etcd.get(self._name_key(team_id, ref))):
                vid = kv.value.decode()
        d = await self._doc_of(vid) if vid else None
        if d is None or (team_id is not None and d.get("team") != team_id):
            raise VolumeNotFound(f"volume {ref!r} not found")
        assert vid is not None
        return self._info(vid, d)

    async def list(self, team_id: str) -> list[VolumeInfo]:
        out = [self._info(v, d) for v, d in self._view.items.items() if d.get("team") == team_id]
        return sorted(out, key=lambda v: (v.created_us, v.volume_id))

    def count(self, team_id: str) -> int:
        return sum(1 for d in self._view.items.values() if d.get("team") == team_id)

    async def delete(self, ref: str, team_id: str) -> None:
        """The records first, then the data (as volumes/store.py)."""
        info = await self.get(ref, team_id)
        ikey, nkey = self._p + "id/" + info.volume_id, self._name_key(team_id, info.name)
        kv = await self._etcd.get(ikey)
        if kv is None:
            raise VolumeNotFound(f"volume {ref!r} not found")
        r = await self._etcd.txn([compare_mod(ikey, "EQUAL", kv.mod_revision)],
                                 [delete_op(ikey), delete_op(nkey)])
        if not r.succeeded:  # deleted (or changed) meanwhile by another node
            raise VolumeNotFound(f"volume {ref!r} not found")
        self._view.items.pop(info.volume_id, None)
        await asyncio.to_thread(shutil.rmtree, self.root / info.volume_id, True)

    async def users_elsewhere(self, volume_id: str) -> list[str]:
        """The sandboxes of the other nodes that mount the volume, running or paused.
        VolumeInUse if a node cannot be asked: its sandboxes might."""
        peers = await others(self._etcd, self._prefix, self._node)
        async with httpx.AsyncClient(timeout=ASK_TIMEOUT_S, verify=self._verify) as client:
            answers = await asyncio.gather(*(client.get(
                f"{p.url}{wire.INTERNAL_PREFIX}/volume-users/{volume_id}",
                headers={wire.TOKEN_HEADER: self._token()}) for p in peers),
                return_exceptions=True)  # fmt: skip
        users: list[str] = []
        for p, a in zip(peers, answers, strict=True):
            if isinstance(a, BaseException) or a.status_code != 200:
                raise VolumeInUse(f"cannot tell whether node {p.name}'s sandboxes mount "
                                  f"volume {volume_id}: it did not answer; try again")
            users += a.json().get("sandboxes", [])
        return users

    async def carry(self, rows: list[tuple[VolumeInfo, str]]) -> list[str]:
        """A joining node's own volumes (info, team), with their ids: written where the
        cluster has neither the id nor the team's name. The names that could not come."""
        clash = []
        for info, team in rows:
            ikey, nkey = self._p + "id/" + info.volume_id, self._name_key(team, info.name)
            doc = {"name": info.name, "team": team, "created_us": info.created_us}
            r = await self._etcd.txn([compare_version(nkey, "EQUAL", 0),
                                      compare_version(ikey, "EQUAL", 0)],
                                     [put_op(nkey, info.volume_id), put_op(ikey, json.dumps(doc))])
            if r.succeeded:
                self._view.items[info.volume_id] = doc
            elif (kv := await self._etcd.get(nkey)) is None or \
                    kv.value.decode() != info.volume_id:
                clash.append(info.name)
        return clash
