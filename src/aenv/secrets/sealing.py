"""Values that grant access, sealed wherever a sandbox record is stored (docs/security.md,
"At rest").

A record's access token, env vars, egress policy (an `egressProxy` password and CA) and
ingress (its traffic token) are written as `sealed:v1:<base64>`: AES-256-GCM under a secrets
key (vault.py), bound to the sandbox and the field, so a value copied into another record
or field does not open. The node's database uses the node's own key file, which it holds
from its first moment; what leaves the node (etcd, the object store, a peer's fork) uses
the cluster's key, which every node holds once it has joined.

A value written before sealing existed (no prefix) is read as it is; the node's database
reseals its rows when it opens.
"""

from __future__ import annotations

import base64

from aenv.secrets.vault import Vault

PREFIX = "sealed:v1:"


class Sealer:
    def __init__(self, vault: Vault) -> None:
        self._vault = vault

    @classmethod
    def of_key(cls, key: bytes) -> Sealer:
        return cls(Vault(key))

    def seal(self, text: str, bound_to: str) -> str:
        sealed = self._vault.seal(text.encode(), bound_to)
        return PREFIX + base64.b64encode(sealed).decode()

    def open(self, text: str, bound_to: str) -> str:
        """The value; an unsealed one as it is (VaultError if it does not open)."""
        if not is_sealed(text):
            return text
        return self._vault.open(base64.b64decode(text[len(PREFIX):]), bound_to).decode()


def is_sealed(text: str) -> bool:
    return text.startswith(PREFIX)
