"""A cluster's teams and keys in its etcd, so every node and gateway knows every key:

    <prefix>teams/team/<teamID>     {"name", "max_sandboxes", "max_memory_mib", "created_us",
                                     "image_registries"}
    <prefix>teams/name/<name>       <teamID> (a name is taken by one team)
    <prefix>teams/key/<keyID>       {"team_id", "name", "hash", "mask", "admin",
                                     "created_us", "revoked_us"}

Reads come from views of those prefixes, kept by etcd's watch (`view.py`), so a request's
key is looked up without a round trip; a change is seen by every node and gateway within a
watch event (milliseconds), and by the one that made it at once. Only keys' SHA-256 are in
etcd. Teams and keys a node had in its own database before it joined stay there, unused.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from typing import Any

from aenv.cluster.etcd import Etcd, compare_version, delete_op, put_op
from aenv.cluster.view import PrefixView
from aenv.teams.model import (
    DEFAULT_TEAM,
    NODE_KEY_ID,
    ApiKey,
    Principal,
    Team,
    TeamExists,
    TeamNotFound,
    check_limit,
    check_name,
    check_registries,
    key_hash,
    mask,
    new_key,
)
from aenv.teams.store import KeyNotFound, check_deletable, check_revocable, limit_changes


def _now_us() -> int:
    return time.time_ns() // 1000


def _team(raw: bytes) -> dict[str, Any] | None:
    try:
        d = json.loads(raw)
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


class EtcdTeams:
    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self._etcd = etcd
        self._p = f"{prefix}teams/"
        self._teams: PrefixView[dict[str, Any]] = PrefixView(etcd, self._p + "team/", _team)
        self._keys: PrefixView[dict[str, Any]] = PrefixView(etcd, self._p + "key/", _team)
        self._by_hash: dict[str, str] = {}
        self._indexed = -1

    async def start(self) -> None:
        """The default team exists; then follow every team and key (EtcdError)."""
        doc = {"name": DEFAULT_TEAM, "max_sandboxes": None, "max_memory_mib": None,
               "created_us": _now_us()}  # fmt: skip
        await self._etcd.txn([compare_version(self._team_key(DEFAULT_TEAM), "EQUAL", 0)],
                             [put_op(self._team_key(DEFAULT_TEAM), json.dumps(doc)),
                              put_op(self._p + "name/" + DEFAULT_TEAM, DEFAULT_TEAM)])
        await self._teams.start()
        await self._keys.start()

    async def stop(self) -> None:
        await self._teams.stop()
        await self._keys.stop()

    # -- reads (from the views) -------------------------------------------------------------

    def principal(self, key: str) -> Principal | None:
        if self._indexed != self._keys.revision or len(self._by_hash) != len(self._keys.items):
            self._by_hash = {d["hash"]: kid for kid, d in self._keys.items.items()}
            self._indexed = self._keys.revision
        kid = self._by_hash.get(key_hash(key))
        d = self._keys.items.get(kid) if kid else None
        if d is None or d.get("revoked_us") is not None or d.get("hash") != key_hash(key):
            return None
        return Principal(d["team_id"], kid, bool(d.get("admin")))  # type: ignore[arg-type]

    def team(self, ref: str) -> Team:
        d = self._teams.items.get(ref)
        if d is None:
            tid = next((t for t, x in self._teams.items.items() if x.get("name") == ref), None)
            d = self._teams.items.get(tid) if tid else None
            ref = tid or ref
        if d is None:
            raise TeamNotFound(f"team {ref!r} not found")
        regs = d.get("image_registries")
        return Team(ref, d["name"], d.get("max_sandboxes"), d.get("max_memory_mib"),
                    int(d.get("created_us", 0)), None if regs is None else tuple(regs))

    def teams(self) -> list[Team]:
        out = [self.team(t) for t in self._teams.items]
        return sorted(out, key=lambda t: (t.created_us, t.team_id))

    def key(self, key_id: str) -> ApiKey:
        d = self._keys.items.get(key_id)
        if d is None:
            raise KeyNotFound(f"key {key_id!r} not found")
        return ApiKey(key_id, d["team_id"], d["name"], d["mask"], bool(d["admin"]),
                      int(d["created_us"]), d.get("revoked_us"))  # fmt: skip

    def keys(self, team_ref: str | None = None) -> list[ApiKey]:
        team = None if team_ref is None else self.team(team_ref).team_id
        out = [self.key(k) for k, d in self._keys.items.items()
               if team is None or d["team_id"] == team]  # fmt: skip
        return sorted(out, key=lambda k: (k.created_us, k.key_id))

    # -- changes ------------------------------------------------------------------------------

    async def bind_node_key(self, key: str) -> None:
        """The cluster's key (every node and gateway has the same) is the default team's
        admin key; a node with a new one replaces it."""
        h = key_hash(key)
        d = self._keys.items.get(NODE_KEY_ID)
        if d is not None and d["hash"] == h:
            return
        await self._put_key(NODE_KEY_ID, {
            "team_id": DEFAULT_TEAM, "name": "the node's key", "hash": h, "mask": mask(key),
            "admin": True, "created_us": _now_us(), "revoked_us": None})

    async def create_team(self, name: object, max_sandboxes: object = None,
                          max_memory_mib: object = None, image_registries: object = None
                          ) -> Team:  # fmt: skip
        name = check_name(name)
        doc = {"name": name, "max_sandboxes": check_limit(max_sandboxes, "maxSandboxes"),
               "max_memory_mib": check_limit(max_memory_mib, "maxMemoryMB"),
               "image_registries": check_registries(image_registries),
               "created_us": _now_us()}  # fmt: skip
        tid = str(uuid.uuid4())
        r = await self._etcd.txn([compare_version(self._p + "name/" + name, "EQUAL", 0)],
                                 [put_op(self._p + "name/" + name, tid),
                                  put_op(self._team_key(tid), json.dumps(doc))])  # fmt: skip
        if not r.succeeded:
            raise TeamExists(f"a team named {name!r} exists")
        self._teams.items[tid] = doc  # seen here at once; the watch brings the same
        return self.team(tid)

    async def set_limits(self, ref: str, **changes: object) -> Team:
        team = self.team(ref)
        checked = limit_changes(team, changes)
        if checked:
            doc = dict(self._teams.items[team.team_id]) | checked
            await self._etcd.put(self._team_key(team.team_id), json.dumps(doc))
            self._teams.items[team.team_id] = doc
        return self.team(team.team_id)

    async def delete_team(self, ref: str) -> Team:
        team = self.team(ref)
        check_deletable(team)
        keys = [k.key_id for k in self.keys(team.team_id)]
        await self._etcd.txn([], [delete_op(self._team_key(team.team_id)),
                                  delete_op(self._p + "name/" + team.name),
                                  *(delete_op(self._p + "key/" + k) for k in keys)])
        self._teams.items.pop(team.team_id, None)
        for k in keys:
            self._keys.items.pop(k, None)
        return team

    async def create_key(self, team_ref: str, name: object = "", admin: bool = False
                         ) -> tuple[ApiKey, str]:  # fmt: skip
        team = self.team(team_ref)
        name = check_name(name, "key") if name else "key"
        key, kid = new_key(), "key_" + secrets.token_hex(8)
        await self._put_key(kid, {"team_id": team.team_id, "name": name, "hash": key_hash(key),
                                  "mask": mask(key), "admin": bool(admin),
                                  "created_us": _now_us(), "revoked_us": None})  # fmt: skip
        return self.key(kid), key

    async def revoke(self, key_id: str) -> ApiKey:
        check_revocable(key_id)
        self.key(key_id)
        d = dict(self._keys.items[key_id])
        if d.get("revoked_us") is None:
            d["revoked_us"] = _now_us()
            await self._put_key(key_id, d)
        return self.key(key_id)

    async def carry(self, teams: list[Team], keys: list[ApiKey], hashes: dict[str, str]
                    ) -> list[str]:  # fmt: skip
        """A node joining the cluster brings the teams and keys of its own database: each
        written only if the cluster has none of that id (and the team's name is free),
        with the same ids, so what the node's records say is theirs stays theirs. The
        node's own key is the cluster's (`bind_node_key`). The names of teams that could
        not come (a team of that name but another id is the cluster's): their sandboxes
        here keep their id, which no key of the cluster names."""
        clash: list[str] = []
        for t in teams:
            if t.team_id == DEFAULT_TEAM:
                continue
            doc = {"name": t.name, "max_sandboxes": t.max_sandboxes,
                   "max_memory_mib": t.max_memory_mib, "created_us": t.created_us,
                   "image_registries": t.image_registries}
            name_key = self._p + "name/" + t.name
            r = await self._etcd.txn([compare_version(name_key, "EQUAL", 0),
                                      compare_version(self._team_key(t.team_id), "EQUAL", 0)],
                                     [put_op(name_key, t.team_id),
                                      put_op(self._team_key(t.team_id), json.dumps(doc))])
            if r.succeeded:
                self._teams.items[t.team_id] = doc
            elif (kv := await self._etcd.get(name_key)) is None or kv.value.decode() != t.team_id:
                clash.append(t.name)
        for k in keys:
            if k.key_id == NODE_KEY_ID or k.key_id not in hashes or \
                    k.team_id not in self._teams.items:  # its team could not come
                continue
            doc = {"team_id": k.team_id, "name": k.name, "hash": hashes[k.key_id],
                   "mask": k.mask, "admin": k.admin, "created_us": k.created_us,
                   "revoked_us": k.revoked_us}  # fmt: skip
            key = self._p + "key/" + k.key_id
            if (await self._etcd.txn([compare_version(key, "EQUAL", 0)],
                                     [put_op(key, json.dumps(doc))])).succeeded:
                self._keys.items[k.key_id] = doc
                self._indexed = -1
        return clash

    def _team_key(self, team_id: str) -> str:
        return self._p + "team/" + team_id

    async def _put_key(self, key_id: str, doc: dict[str, Any]) -> None:
        await self._etcd.put(self._p + "key/" + key_id, json.dumps(doc))
        self._keys.items[key_id] = doc
        self._indexed = -1
