"""A cluster's secrets: in its etcd, so every node reads them (a sandbox resumed or forked on
another node keeps its rules working), sealed under the secrets key that every node holds.

    <prefix>secrets/id/<secretID>    {"name", "team", "version", "metadata", "created_us",
                                      "updated_us", "sealed": {version: base64}}
    <prefix>secrets/name/<name>      <secretID>, for the default team's (as before teams)
    <prefix>secrets/name/{<team>}<name>  <secretID>, for another team's ('{' is in no name)
    <prefix>secrets/key              the cluster's key, unless the operator gives one
    <prefix>secrets/key-check        a value sealed under the cluster's key
    <prefix>secrets/egress-ca        the egress CA (interception_ca.py): its certificate, and
                                     its key unless the operator gives the files

Where the operator gives every node the same `secrets_key_file` (and egress CA files), the
key (and the CA's key) never enter etcd: the first node seals a check value and records its
CA's certificate, and a node whose key does not open the value, or whose CA is another,
refuses to start rather than write secrets no other node can read. Where it gives none, the
first node's key and CA become the cluster's, in etcd, and the others adopt them: then etcd
holds what opens the secrets, and must be guarded as such (docs/cluster.md).

Changes are transactions guarded by the revisions read: concurrent writers lose no version.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from aenv.cluster.etcd import (
    Etcd,
    compare_mod,
    compare_version,
    delete_op,
    put_op,
)
from aenv.secrets.store import (
    SecretExists,
    SecretInfo,
    SecretNotFound,
    check_limit,
    check_metadata,
    check_new,
    check_value,
    new_id,
    page_token,
    parse_page_token,
)
from aenv.secrets.vault import Vault, VaultError
from aenv.teams.model import DEFAULT_TEAM

KEEP_VERSIONS = 16  # older versions are dropped: etcd values stay small
_CHECK = b"aenv secrets key check"
_RETRIES = 8


class SecretsKeyMismatch(RuntimeError):
    pass


def _now_us() -> int:
    return time.time_ns() // 1000


class EtcdSecrets:
    def __init__(self, etcd: Etcd, prefix: str, vault: Vault) -> None:
        self._etcd, self._vault = etcd, vault  # join() may replace the vault
        self._p = f"{prefix}secrets/"
        self.key: bytes | None = None  # the cluster's key, from join()

    async def join(self, local_key: bytes, explicit: bool) -> Vault:
        """The vault this node uses for the cluster's secrets. `explicit`: the operator gave
        the key file (every node the same): it is checked against the cluster's and never
        written to etcd. Else the first node's key becomes the cluster's, in etcd, and the
        others adopt it. SecretsKeyMismatch if an explicit key is not the cluster's. The
        cluster's key is then `key`."""
        if not explicit:
            if not self._etcd.security.protects(self._etcd.endpoints):  # etcd_insecure too
                raise SecretsKeyMismatch(
                    "no secrets_key_file, and etcd is reached without TLS and "
                    "authentication: the cluster's secrets key would cross the network in "
                    "the clear; give every node the same secrets_key_file, or secure the "
                    "etcd link (docs/cluster.md)")
            key = self._p + "key"
            await self._etcd.txn([compare_version(key, "EQUAL", 0)],
                                 [put_op(key, base64.b64encode(local_key))])  # fmt: skip
            kv = await self._etcd.get(key)
            assert kv is not None
            self.key = base64.b64decode(kv.value)
        else:
            self.key = local_key
        self._vault = Vault(self.key)
        await self._check_key()
        return self._vault

    async def _check_key(self) -> None:
        key = self._p + "key-check"
        sealed = self._vault.seal(_CHECK, key)
        await self._etcd.txn([compare_version(key, "EQUAL", 0)], [put_op(key, sealed)])
        kv = await self._etcd.get(key)
        assert kv is not None
        try:
            ok = self._vault.open(kv.value, key) == _CHECK
        except VaultError:
            ok = False
        if not ok:
            raise SecretsKeyMismatch(
                "this node's secrets key is not the cluster's: give every node the same "
                "secrets_key_file (AENV_SECRETS_KEY_FILE), or none")

    async def join_ca(self, cert: str, key: str, explicit: bool) -> tuple[str, str]:
        """The egress CA (certificate, key PEM) every node signs with: the first node's,
        recorded in etcd (its key too, unless `explicit`: the operator gave every node the
        files, which are then only checked). SecretsKeyMismatch if explicit ones differ."""
        k = self._p + "egress-ca"
        doc = {"cert": cert} if explicit else {"cert": cert, "key": key}
        await self._etcd.txn([compare_version(k, "EQUAL", 0)], [put_op(k, json.dumps(doc))])
        kv = await self._etcd.get(k)
        assert kv is not None
        theirs = json.loads(kv.value)
        if theirs["cert"].strip() == cert.strip():
            return cert, key
        if explicit or "key" not in theirs:
            raise SecretsKeyMismatch(
                "this node's egress CA is not the cluster's: give every node the same "
                "network.ca_cert_file and ca_key_file, or none")
        return theirs["cert"], theirs["key"]

    async def create(self, team_id: str, name: object, value: object, metadata: object = None
                     ) -> SecretInfo:  # fmt: skip
        n, data, meta = check_new(name, value, metadata)
        sid, now = new_id(), _now_us()
        doc = {"name": n, "team": team_id, "version": 1, "metadata": meta, "created_us": now,
               "updated_us": now, "sealed": {"1": self._seal(sid, 1, data)}}  # fmt: skip
        name_key = self._name_key(team_id, n)
        r = await self._etcd.txn([compare_version(name_key, "EQUAL", 0)],
                                 [put_op(name_key, sid),
                                  put_op(self._id_key(sid), json.dumps(doc))])  # fmt: skip
        if not r.succeeded:
            raise SecretExists(f"a secret named {n!r} exists")
        return _info(sid, doc)

    async def update(self, team_id: str, ref: str, value: object, metadata: object = None
                     ) -> SecretInfo:  # fmt: skip
        data = check_value(value)
        meta = None if metadata is None else check_metadata(metadata)
        for _ in range(_RETRIES):
            sid, doc, rev = await self._read(team_id, ref)
            version = int(doc["version"]) + 1
            sealed: dict[str, str] = doc["sealed"]
            sealed[str(version)] = self._seal(sid, version, data)
            for old in sorted(sealed, key=int)[:-KEEP_VERSIONS]:
                del sealed[old]
            doc.update(version=version, updated_us=_now_us())
            if meta is not None:
                doc["metadata"] = meta
            key = self._id_key(sid)
            r = await self._etcd.txn([compare_mod(key, "EQUAL", rev)],
                                     [put_op(key, json.dumps(doc))])  # fmt: skip
            if r.succeeded:
                return _info(sid, doc)
        raise SecretExists(f"secret {ref!r} changed under every attempt; try again")

    async def delete(self, team_id: str, ref: str) -> None:
        sid, doc, _ = await self._read(team_id, ref)
        await self._etcd.txn([], [delete_op(self._id_key(sid)),
                                  delete_op(self._name_key(team_id, doc["name"]))])  # fmt: skip

    async def get(self, team_id: str, ref: str) -> SecretInfo:
        sid, doc, _ = await self._read(team_id, ref)
        return _info(sid, doc)

    async def _docs(self, team_id: str) -> list[tuple[str, dict[str, Any]]]:
        kvs, _ = await self._etcd.get_prefix(self._p + "id/")
        docs = ((kv.key.rsplit("/", 1)[1], json.loads(kv.value)) for kv in kvs)
        return [(sid, d) for sid, d in docs if _team(d) == team_id]

    async def page(self, team_id: str, limit: int, token: str | None
                   ) -> tuple[list[SecretInfo], str | None]:  # fmt: skip
        check_limit(limit)
        after = parse_page_token(token)
        items = sorted((_info(sid, d) for sid, d in await self._docs(team_id)),
                       key=lambda i: (i.created_us, i.secret_id))  # fmt: skip
        items = [i for i in items if (i.created_us, i.secret_id) > after]
        page = items[:limit]
        return page, page_token(page[-1]) if len(items) > limit else None

    async def count(self, team_id: str) -> int:
        return len(await self._docs(team_id))

    async def value(self, team_id: str, ref: str) -> str:
        sid, doc, _ = await self._read(team_id, ref)
        v = int(doc["version"])
        sealed = base64.b64decode(doc["sealed"][str(v)])
        return self._vault.open(sealed, f"{sid}/{v}").decode()

    def _seal(self, sid: str, version: int, data: bytes) -> str:
        return base64.b64encode(self._vault.seal(data, f"{sid}/{version}")).decode()

    def _id_key(self, sid: str) -> str:
        return self._p + "id/" + sid

    def _name_key(self, team_id: str, name: str) -> str:
        return self._p + "name/" + (name if team_id == DEFAULT_TEAM else f"{{{team_id}}}{name}")

    async def _read(self, team_id: str, ref: str) -> tuple[str, dict[str, Any], int]:
        """(id, document, its mod revision) of the team's secret, by id or by name."""
        sid = ref
        if not ref.startswith("sec_"):
            kv = await self._etcd.get(self._name_key(team_id, ref.strip().lower()))
            if kv is None:
                raise SecretNotFound(f"secret {ref!r} not found")
            sid = kv.value.decode()
        kv = await self._etcd.get(self._id_key(sid))
        if kv is None or _team(doc := json.loads(kv.value)) != team_id:
            raise SecretNotFound(f"secret {ref!r} not found")
        return sid, doc, kv.mod_revision


def _team(doc: dict[str, Any]) -> str:
    return str(doc.get("team") or DEFAULT_TEAM)  # written before teams: the default's


def _info(sid: str, doc: dict[str, Any]) -> SecretInfo:
    return SecretInfo(sid, doc["name"], int(doc["version"]), dict(doc["metadata"]),
                      int(doc["created_us"]), int(doc["updated_us"]))  # fmt: skip

