"""The catalog of published snapshots, and a paused sandbox's record as it travels
(cluster/published.py, cluster/takeover.py)."""

from __future__ import annotations

import json

from aenv.cluster.published import PublishedEntry, newest
from aenv.cluster.takeover import record_json, record_of
from aenv.network.egress import EgressPolicy
from aenv.orchestrator.routes import Ingress
from aenv.orchestrator.states import SandboxState
from aenv.orchestrator.store import SandboxRecord
from aenv.secrets.sealing import Sealer

SEALER = Sealer.of_key(bytes(32))


def _e(sid: str, names: list[str], at: str) -> PublishedEntry:
    return PublishedEntry(snapshot_id=sid, names=names, memory_mib=512, node="n0", created_at=at)


def test_a_name_names_its_newest_snapshot_and_an_id_its_own() -> None:
    entries = [_e("snap-a", ["x"], "2026-12-01T00:00:01Z"),
               _e("snap-b", ["x", "y"], "2026-12-01T00:00:02Z")]  # fmt: skip
    assert newest(entries, "x").snapshot_id == "snap-b"  # type: ignore[union-attr]
    assert newest(entries, "snap-a").snapshot_id == "snap-a"  # type: ignore[union-attr]
    assert newest(entries, "z") is None


def test_a_record_survives_the_trip_through_the_store() -> None:
    rec = SandboxRecord(
        sandbox_id="abc", template_id="base", state=SandboxState.PAUSED, started_at_us=1,
        end_at_us=2, timeout_s=300, vcpus=1, memory_mib=512, disk_mib=4096,
        envd_version="0.6.4", metadata={"k": "v"}, env_vars={"E": "1"}, access_token="tok",
        egress=EgressPolicy.from_request(False, ["198.18.0.1"], [], ["1.1.1.1"]),
        pause_mode="full", ingress=Ingress("traffic", "h:${PORT}", frozenset({8443})),
    )  # fmt: skip
    assert record_of(json.loads(json.dumps(record_json(rec, SEALER))), SEALER) == rec
