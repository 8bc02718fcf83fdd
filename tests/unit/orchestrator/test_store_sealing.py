"""What grants access in a sandbox record is sealed wherever the record is stored (issue 33):
the node's database, and the record that leaves the node (etcd, the object store, a peer)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from aenv.cluster.takeover import record_json, record_of
from aenv.network.egress import EgressPolicy
from aenv.orchestrator.routes import Ingress
from aenv.orchestrator.states import SandboxState
from aenv.orchestrator.store import SEALED_COLUMNS, SandboxRecord, Store
from aenv.secrets.sealing import Sealer, is_sealed
from aenv.secrets.vault import VaultError
from tests.support.tls import make_certs

KEY, OTHER = Sealer.of_key(bytes(32)), Sealer.of_key(b"\x01" * 32)


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_certs(tmp_path_factory.mktemp("ca"), "example.test").ca.read_text()


def _clear(pem: str) -> tuple[str, ...]:
    """What must not be found: every credential, and a line of the CA's PEM."""
    return ("tok-secret", "envsecret", "proxypass", pem.splitlines()[2], "traffic-secret")


def _rec(pem: str, sid: str = "s1") -> SandboxRecord:
    proxy = {"address": "198.18.0.9:1080", "username": "u", "password": "proxypass",
             "tls": {"enabled": True, "caCert": pem}}
    return SandboxRecord(
        sandbox_id=sid, template_id="base", state=SandboxState.CREATING, started_at_us=1,
        end_at_us=2, timeout_s=300, vcpus=1, memory_mib=512, disk_mib=4096,
        envd_version="0.6.4", env_vars={"API_KEY": "envsecret"}, access_token="tok-secret",
        egress=EgressPolicy.from_request(True, [], [], None, proxy),
        ingress=Ingress("traffic-secret", None, frozenset()),
    )  # fmt: skip


def _on_disk(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_the_database_holds_no_credential_in_the_clear(tmp_path: Path, pem: str) -> None:
    store = Store(tmp_path / "aenv.db", KEY)
    store.open()
    r = _rec(pem)
    store.insert(r)
    assert store.get("s1") == r
    assert store.set_egress("s1", [SandboxState.CREATING], r.egress, True, 3)
    store.close()
    raw = _on_disk(tmp_path / "aenv.db")
    for clear in _clear(pem):
        assert clear.encode() not in raw, clear
    # ...and under another key nothing opens
    with pytest.raises(VaultError):
        other = Store(tmp_path / "aenv.db", OTHER)
        other.open()
        other.get("s1")


def test_a_sealed_value_moved_to_another_row_does_not_open(tmp_path: Path, pem: str) -> None:
    store = Store(tmp_path / "aenv.db", KEY)
    store.open()
    store.insert(_rec(pem, "s1"))
    store.insert(_rec(pem, "s2"))
    tok = store.db.execute("SELECT access_token FROM sandboxes WHERE sandbox_id='s1'").fetchone()
    store.db.execute("UPDATE sandboxes SET access_token=? WHERE sandbox_id='s2'", tok)
    with pytest.raises(VaultError):
        store.get("s2")
    store.close()


def test_a_database_written_before_sealing_is_sealed_when_opened(tmp_path: Path,
                                                                pem: str) -> None:
    path = tmp_path / "aenv.db"
    store = Store(path, KEY)
    store.open()
    r = _rec(pem)
    store.insert(r)
    # as an older node wrote it: the columns in the clear
    plain = {"env_vars": json.dumps(r.env_vars), "access_token": r.access_token,
             "egress": json.dumps(r.egress.to_json()), "ingress": json.dumps(r.ingress.to_json())}
    store.db.execute(f"UPDATE sandboxes SET {', '.join(f'{c}=?' for c in SEALED_COLUMNS)}",
                     [plain[c] for c in SEALED_COLUMNS])  # fmt: skip
    store.close()
    assert b"proxypass" in sqlite3.connect(path).execute(
        "SELECT egress FROM sandboxes").fetchone()[0].encode()
    store.open()
    assert store.get("s1") == r
    store.close()
    row = sqlite3.connect(path).execute(
        f"SELECT {', '.join(SEALED_COLUMNS)} FROM sandboxes").fetchone()
    assert all(is_sealed(v) for v in row)


def test_a_record_leaves_the_node_sealed_and_opens_under_the_clusters_key(pem: str) -> None:
    r = _rec(pem)
    out = json.dumps(record_json(r, KEY))
    for clear in _clear(pem):
        assert clear not in out, clear
    assert record_of(json.loads(out), KEY) == r
    with pytest.raises(VaultError):
        record_of(json.loads(out), OTHER)
    # one published before sealing opens as it is
    d = json.loads(out)
    d.update(env_vars=r.env_vars, access_token=r.access_token, egress=r.egress.to_json(),
             ingress=r.ingress.to_json())
    assert record_of(d, KEY) == r
