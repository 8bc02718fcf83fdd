"""The secrets key and AES-GCM sealing (secrets/vault.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aenv.secrets.vault import Vault, VaultError, load_key


def test_the_key_is_made_once_even_when_many_ask_at_once(tmp_path: Path) -> None:
    path = tmp_path / "d" / "secrets.key"
    with ThreadPoolExecutor(8) as pool:
        keys = set(pool.map(lambda _: load_key(path), range(32)))
    assert len(keys) == 1 and len(next(iter(keys))) == 32
    assert sorted(p.name for p in path.parent.iterdir()) == ["secrets.key"]  # no temp files
    path.write_bytes(b"short")
    with pytest.raises(VaultError, match="5 bytes"):
        load_key(path)


def test_a_sealed_value_opens_only_where_it_was_sealed(tmp_path: Path) -> None:
    v = Vault(load_key(tmp_path / "k"))
    sealed = v.seal(b"value", "sec_1/1")
    assert v.open(sealed, "sec_1/1") == b"value"
    assert v.seal(b"value", "sec_1/1") != sealed  # a fresh nonce every time
    for bad in (lambda: v.open(sealed, "sec_1/2"),  # moved to another version
                lambda: v.open(sealed[:-1] + bytes([sealed[-1] ^ 1]), "sec_1/1"),
                lambda: Vault(load_key(tmp_path / "other")).open(sealed, "sec_1/1")):
        with pytest.raises(VaultError):
            bad()
