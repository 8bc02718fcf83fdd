"""The key that encrypts secret values at rest, and the encryption itself (AES-256-GCM).

The key is 32 random bytes in a file (mode 0600): `secrets_key_file`, else
`<data_dir>/secrets.key`, made on first use. It is made exclusively (a link that fails if
the file exists), so two nodes that start at once on one data directory end up with the
same key, never with values encrypted under a key that was then replaced. Every node of a
cluster needs the same file, as a sandbox resumed or forked elsewhere resolves its
secrets there.

Each value is sealed with a fresh 96-bit nonce, and bound to its secret id and version as
associated data, so a ciphertext moved to another row does not open.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from aenv.config import Config

KEY_BYTES = 32
NONCE_BYTES = 12


class VaultError(RuntimeError):
    """The key is unusable, or a value does not open under it."""


def key_path(config: Config) -> Path:
    return config.secrets_key_file or config.data_dir / "secrets.key"


def load_key(path: Path) -> bytes:
    """The key at `path`, made now if there is none."""
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = _make(path)
    if len(key) != KEY_BYTES:
        raise VaultError(f"{path} holds {len(key)} bytes; a secrets key is {KEY_BYTES}")
    return key


def _make(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        with contextlib.suppress(FileExistsError):  # another process made it first: theirs
            os.link(tmp, path)
    finally:
        tmp.unlink()
    return path.read_bytes()


class Vault:
    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, plain: bytes, bound_to: str) -> bytes:
        nonce = secrets.token_bytes(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plain, bound_to.encode())

    def open(self, sealed: bytes, bound_to: str) -> bytes:
        try:
            return self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:],
                                      bound_to.encode())  # fmt: skip
        except InvalidTag:
            raise VaultError("a secret value does not open under this node's key (a node "
                             "of the cluster with another secrets key?)") from None
