"""Start-up reclaim over a scratch data directory: its files step keeps what it is told to
and a fork's leftover snapshot goes (its own, or one it fetched for another node's fork);
the steps run and are timed in their fixed order. (The process, cgroup and network steps
act on real leftovers in tests/e2e/test_faults.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from aenv.config import Config, MachineShape
from aenv.orchestrator import reclaim
from aenv.storage.snapshots import Manifest, SnapshotStore


def test_files_step_keeps_named_and_pooled_dirs_and_drops_the_rest(tmp_path: Path) -> None:
    cfg = Config(data_dir=tmp_path, instance="u1")
    vms = cfg.sandboxes_dir
    for d in ("paused1", "pool-a", "gone1", "pool-b"):
        (vms / d).mkdir(parents=True)
    (vms / "running1").symlink_to("pool-a")  # restored into a pooled VM
    snaps = SnapshotStore(cfg.snapshots_dir)
    for sid in ("fork-gone1-ab12", "fork-othernode-cd34", "snap-1"):
        (cfg.snapshots_dir / sid).mkdir(parents=True)
        (cfg.snapshots_dir / sid / "manifest.json").write_text(json.dumps({}))
    # Fork snapshots fetched from another node to start its children here (by u1) and by
    # another instance of this data directory (u2).
    for sid, by in (("fork-remote1-ef56", "u1"), ("fork-remote2-ab90", "u2")):
        (cfg.snapshots_dir / sid).mkdir()
        man = Manifest(snapshot_id=sid, shape=MachineShape(), kernel="k", tools="t",
                       cmdline="", template="base", parent="remote1",
                       fetched={"at": 1.0, "instance": by})  # fmt: skip
        (cfg.snapshots_dir / sid / "manifest.json").write_text(json.dumps(man.to_json()))

    out = reclaim.reclaim(cfg, snaps, live_vms=set(), keep_dirs={"paused1", "running1"},
                          keep_slots=(), pool_wait_ms=1.5)  # fmt: skip

    assert sorted(p.name for p in vms.iterdir()) == ["paused1", "pool-a", "running1"]
    assert sorted(p.name for p in cfg.snapshots_dir.iterdir()) == [
        "fork-othernode-cd34", "fork-remote2-ab90", "snap-1",
    ]  # another instance's forks are not ours to delete
    assert sorted(out.items) == ["dir:gone1", "dir:pool-b", "snapshot:fork-gone1-ab12",
                                 "snapshot:fork-remote1-ef56"]  # fmt: skip
    assert list(out.ms) == ["pool_wait", "scan", *reclaim.STEPS]
    assert out.ms["pool_wait"] == 1.5
