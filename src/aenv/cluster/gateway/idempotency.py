"""Idempotent creates across gateways: a create with an `Idempotency-Key` makes at most one
sandbox, whichever gateway each try reaches and whether or not an earlier one died.

The first try claims the key in etcd (`<prefix>idempotency/<hash of API key and key>`, put
only if absent) with the sandbox id it will create. Every later try with that key reads
the same id, so all tries place and create the same sandbox:

- placed already (the id is bound): the create goes again to that node under that id,
  and the node answers with the sandbox that id made, waiting for its boot if it is under
  way (`Orchestrator._made`);
- not placed yet (the first try died before), or its placement was given back: this try
  places it;
- bound to a node that is lost: 502, and the key is let go, so the next try starts over.

A try whose create the node refused lets the key go with the binding, so that a retry is
a new attempt (E2B's rule: an error is not replayed). A key reused with a different body
is 409. Keys are kept 24 to 25 hours, attached to a lease each gateway takes for an hour
of claims; the entry holds the id and a body hash, never a token.

A retry without a key (connection errors, 502/503/504) can make a second sandbox when the
first try's create had reached its node: the first one then runs until its timeout.
"""

from __future__ import annotations

import hashlib
import time

from pydantic import BaseModel, ValidationError

from aenv.cluster.etcd import (
    Etcd,
    EtcdError,
    TxnResult,
    compare_mod,
    compare_version,
    delete_op,
    put_op,
    range_op,
)
from aenv.orchestrator.requests import new_sandbox_id

RETAIN_S = 24 * 3600
LEASE_FOR_S = 3600  # one lease carries this long of claims, so each lives RETAIN_S or more
HEADER = b"idempotency-key"


class Claim(BaseModel):
    sandbox_id: str
    body_sha256: str
    at: float
    done: bool = False  # its create succeeded: a try after that must not make it again
    received: bool = False  # a retry's answer reached its client (gateway/orphans.py)


class KeyReused(Exception):
    pass


class Idempotency:
    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self.etcd = etcd
        self.prefix = f"{prefix}idempotency/"
        self._lease = 0
        self._lease_until = 0.0

    def key(self, api_key: str, idempotency_key: str) -> str:
        digest = hashlib.sha256(f"{api_key}\0{idempotency_key}".encode()).hexdigest()
        return self.prefix + digest[:40]

    async def _lease_id(self) -> int:
        now = time.monotonic()
        if not self._lease or now > self._lease_until:
            self._lease = await self.etcd.grant(RETAIN_S + LEASE_FOR_S)
            self._lease_until = now + LEASE_FOR_S
        return self._lease

    async def _txn(self, key: str, claim: Claim, compare: dict[str, object]) -> TxnResult:
        for _ in range(2):
            try:
                return await self.etcd.txn([compare], [put_op(key, claim.model_dump_json(),
                                                              await self._lease_id())],
                                           [range_op(key)])  # fmt: skip
            except EtcdError as e:
                if "lease not found" not in str(e):
                    raise
                self._lease = 0  # etcd lost it (restored, or it expired): a new one
        raise EtcdError("no lease for idempotency keys")

    async def claim(self, key: str, body: bytes) -> tuple[Claim, bool]:
        """The key's claim, and whether this try made it. KeyReused if the key was claimed
        for another request body."""
        digest = hashlib.sha256(body).hexdigest()
        mine = Claim(sandbox_id=new_sandbox_id(), body_sha256=digest, at=time.time())
        r = await self._txn(key, mine, compare_version(key, "EQUAL", 0))
        if r.succeeded:
            return mine, True
        kvs = r.ranges()[0] if r.ranges() else []
        if not kvs:  # gone between the compare and now: expired; claim again
            return await self.claim(key, body)
        try:
            theirs = Claim.model_validate_json(kvs[0].value)
        except ValidationError:
            theirs = None
        if theirs is None or theirs.body_sha256 != digest:
            raise KeyReused("this Idempotency-Key was used for a different request")
        return theirs, False

    async def done(self, key: str, claim: Claim) -> None:
        """Its create succeeded (best effort: a try that finds it not done asks the node,
        which answers with the sandbox the id made)."""
        await self._txn(key, claim.model_copy(update={"done": True}),
                        compare_version(key, "GREATER", 0))

    async def received(self, key: str, claim: Claim) -> None:
        """A retry's answer went to a client still there: its sandbox is nobody's orphan."""
        await self._txn(key, claim.model_copy(update={"done": True, "received": True}),
                        compare_version(key, "GREATER", 0))

    async def get(self, key: str) -> Claim | None:
        kv = await self.etcd.get(key)
        if kv is None:
            return None
        try:
            return Claim.model_validate_json(kv.value)
        except ValidationError:
            return None

    async def let_go(self, key: str, claim: Claim) -> None:
        """Drop the key if it still names `claim`'s sandbox (the next try starts over)."""
        kv = await self.etcd.get(key)
        if kv is None:
            return
        try:
            if Claim.model_validate_json(kv.value).sandbox_id != claim.sandbox_id:
                return
        except ValidationError:
            pass
        await self.etcd.txn([compare_mod(key, "EQUAL", kv.mod_revision)], [delete_op(key)])
