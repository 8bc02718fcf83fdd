"""The leak census's diff rules on hand-made censuses, and the file side of a census over a
scratch data directory (the host side is exercised by every VM test's teardown)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from aenv.config import Config
from aenv.images import stepgc
from aenv.machines import machine
from aenv.orchestrator import census as cm
from aenv.orchestrator.census import Census, Resource
from aenv.orchestrator.states import SandboxState

S = SandboxState
I = "u1"  # noqa: E741


def _c(tmp_path: Path, *res: Resource, records: dict[str, S] | None = None,
       live: bool = False) -> Census:  # fmt: skip
    c = Census(data_dir=tmp_path, home="aenv", resources=list(res),
               records={I: records or {}}, live={I} if live else set())  # fmt: skip
    return c


def _vmdir(tmp_path: Path, name: str, *, paused: bool = False, to: str | None = None
           ) -> Resource:
    p = tmp_path / name
    if to is not None:
        return Resource("vmdir", str(p), I, name, f"-> {to}")
    p.mkdir()
    if paused:
        (p / "manifest.json").write_text("{}")
    return Resource("vmdir", str(p), I, name, "paused" if paused else "")


def _vm(name: str) -> list[Resource]:
    return [Resource("process", "10", I, name, "unshare, cgroup"),
            Resource("process", "11", I, name, "qemu-system-x86_64, cgroup"),
            Resource("cgroup", f"/sys/fs/cgroup/memory/aenv/{I}-{name}", I, name)]


def _kinds(d: cm.Diff) -> list[str]:
    return sorted(x.resource.kind for x in d.leaks)


def test_a_live_node_with_pool_vms_idle_slots_and_its_sandboxes_is_clean(tmp_path: Path) -> None:
    res = [*_vm("pool-a"), _vmdir(tmp_path, "pool-a"),  # a warm-pool VM
           *_vm("pool-b"), _vmdir(tmp_path, "pool-b"), _vmdir(tmp_path, "sb1", to="pool-b"),
           _vmdir(tmp_path, "sb2", paused=True),
           Resource("netns", f"{I}-s0", I, f"{I}-s0"), Resource("tap", f"{I}-s0/tap0", I),
           Resource("nft", f"{I}-s0/inet aenv", I), Resource("link", f"{I}-0h", I, f"{I}-s0"),
           Resource("netns", f"{I}-s1", I, f"{I}-s1"),  # idle
           Resource("db", "x.db", I), Resource("instdir", "d", I)]  # fmt: skip
    d = cm.diff(_c(tmp_path, *res, records={"sb1": S.RUNNING, "sb2": S.PAUSED}, live=True))
    assert d.clean, d.lines()


def test_after_the_node_stopped_everything_but_paused_state_is_a_leak(tmp_path: Path) -> None:
    res = [*_vm("pool-a"), _vmdir(tmp_path, "pool-a"), _vmdir(tmp_path, "sb2", paused=True),
           Resource("netns", f"{I}-s0", I, f"{I}-s0"), Resource("link", f"{I}-0h", I, f"{I}-s0"),
           Resource("link", f"{I}-5h", I, f"{I}-s5")]  # fmt: skip
    d = cm.diff(_c(tmp_path, *res, records={"sb2": S.PAUSED}))
    assert _kinds(d) == ["cgroup", "link", "link", "netns", "process", "process", "vmdir"]
    assert not d.ghosts


def test_a_host_veth_without_its_namespace_is_a_leak_even_on_a_live_node(tmp_path: Path) -> None:
    d = cm.diff(_c(tmp_path, Resource("link", f"{I}-3h", I, f"{I}-s3"), live=True))
    assert _kinds(d) == ["link"]


def test_records_whose_resources_are_gone_are_ghosts(tmp_path: Path) -> None:
    res = [_vmdir(tmp_path, "run-no-vmm"), _vmdir(tmp_path, "paused-no-manifest"),
           *_vm("paused-with-vmm"), _vmdir(tmp_path, "paused-with-vmm", paused=True)]
    recs = {"run-no-vmm": S.RUNNING, "run-no-dir": S.SNAPSHOTTING,
            "paused-no-manifest": S.PAUSED, "paused-with-vmm": S.PAUSED,
            "creating": S.CREATING, "killing": S.KILLING}  # fmt: skip
    d = cm.diff(_c(tmp_path, *res, records=recs, live=True))
    assert {(g.sandbox_id, g.missing.split()[0]) for g in d.ghosts} == {
        ("run-no-vmm", "no"), ("run-no-dir", "its"), ("paused-no-manifest", "its")}
    # A running node keeps a paused sandbox's stopped VMM (the hot tier) ...
    assert not d.leaks
    # ... a node that is not running does not: its VMM is a leak and the record a ghost.
    d = cm.diff(_c(tmp_path, *res, records=recs))
    assert ("paused-with-vmm", "a") in {(g.sandbox_id, g.missing.split()[0]) for g in d.ghosts}
    assert {(r.resource.kind, r.resource.owner) for r in d.leaks} >= {
        ("process", "paused-with-vmm"), ("cgroup", "paused-with-vmm")}


def test_a_stopped_instance_with_no_records_leaks_its_database_and_directory(
    tmp_path: Path,
) -> None:
    res = [Resource("db", "u1.db", I), Resource("instdir", "d", I)]
    assert _kinds(cm.diff(_c(tmp_path, *res))) == ["db", "instdir"]
    assert cm.diff(_c(tmp_path, *res, records={"p": S.PAUSED}), records={I: {}}).leaks
    home = Census(data_dir=tmp_path, home=I, resources=res, records={I: {}})
    assert cm.diff(home).clean  # this host's own instance keeps them


def test_a_baseline_splits_what_an_earlier_run_left_from_new_leaks(tmp_path: Path) -> None:
    old = [*_vm("pool-a"), Resource("netns", f"{I}-s0", I, f"{I}-s0")]
    earlier = cm.diff(_c(tmp_path, *old, records={"gone": S.RUNNING}))
    # Round trip through JSON, as `aenv census --json` and `--baseline` do.
    baseline = json.loads(json.dumps(earlier.to_json()))
    later = cm.diff(_c(tmp_path, *old, *_vm("pool-b"), records={"gone": S.RUNNING,
                                                                "new": S.RUNNING}))
    new, before = later.split(baseline)
    assert _kinds(new) == ["cgroup", "process", "process"]
    assert {x.resource.owner for x in new.leaks} == {"pool-b"}
    assert [g.sandbox_id for g in new.ghosts] == ["new"]
    assert len(before.leaks) == len(earlier.leaks) and [g.sandbox_id for g in before.ghosts] == [
        "gone"]
    # The same resource under another reason is still the earlier one.
    renamed = cm.Diff([cm.Leak(x.resource, "another reason") for x in earlier.leaks])
    assert renamed.split(baseline)[0].clean
    assert later.split({})[0].lines() == later.lines()


def test_fork_snapshots_staging_and_strict_snapshots(tmp_path: Path) -> None:
    fork = Resource("forksnap", "fork-src-1", I, "src")
    assert cm.diff(_c(tmp_path, fork, records={"src": S.FORKING}, live=True)).leaks == []
    assert _kinds(cm.diff(_c(tmp_path, fork, records={"src": S.RUNNING}, live=True))) == [
        "forksnap"]
    stray = Resource("staging", ".tmp-snap-1")
    assert _kinds(cm.diff(_c(tmp_path, stray))) == ["staging"]
    assert cm.diff(_c(tmp_path, stray, live=True)).leaks == []  # maybe a write in flight
    snap = Resource("snapshot", "snap-1", None, "gone-sandbox")
    assert cm.diff(_c(tmp_path, snap)).clean
    assert _kinds(cm.diff(_c(tmp_path, snap), strict=True)) == ["snapshot"]
    host_tap = Resource("tap", "eth9", detail="in the host namespace")
    assert _kinds(cm.diff(_c(tmp_path, host_tap, live=True))) == ["tap"]


def _db(path: Path, rows: list[tuple[str, str]]) -> None:
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE sandboxes (sandbox_id TEXT PRIMARY KEY, state TEXT)")
        con.executemany("INSERT INTO sandboxes VALUES (?, ?)", rows)
    con.close()


def test_census_of_a_data_directory_finds_and_attributes_files(tmp_path: Path) -> None:
    cfg = Config(data_dir=tmp_path, instance="aenv")
    vms = tmp_path / "sandboxes" / I
    (vms / "sbpaused").mkdir(parents=True)
    (vms / "sbpaused" / "manifest.json").write_text("{}")
    (vms / "pool-1").mkdir()
    (vms / "sbrun").symlink_to("pool-1")
    _db(tmp_path / f"{I}.db", [("sbpaused", "paused"), ("sbrun", "running")])
    snaps = tmp_path / "snapshots"
    for d in ("fork-sbrun-ab12", ".tmp-fork-sbrun-cd34", ".del-snap-9-aa", "snap-1", "tpl-x",
              "broken"):
        (snaps / d).mkdir(parents=True)
    (snaps / "snap-1" / "manifest.json").write_text(json.dumps({"parent": "sbpaused"}))
    (snaps / "tpl-x" / "manifest.json").write_text(json.dumps({"parent": None}))
    (tmp_path / "templates" / ".tmp-base-1").mkdir(parents=True)

    c = cm.census(cfg, I)
    got = {(r.kind, Path(r.name).name, r.owner, r.detail) for r in c.resources}
    assert got == {
        ("instdir", I, None, "3 entries"),
        ("vmdir", "pool-1", "pool-1", ""),
        ("vmdir", "sbpaused", "sbpaused", "paused"),
        ("vmdir", "sbrun", "sbrun", "-> pool-1"),
        ("db", f"{I}.db", None, ""),
        ("forksnap", "fork-sbrun-ab12", "sbrun", ""),
        ("staging", ".tmp-fork-sbrun-cd34", "sbrun", ""),
        ("snapshot", "snap-1", "sbpaused", ""),
    }  # unattributable staging and broken snapshots belong to no instance
    assert c.records == {I: {"sbpaused": S.PAUSED, "sbrun": S.RUNNING}}
    assert c.live == set()
    whole = {(r.kind, Path(r.name).name) for r in cm.census(cfg).resources}
    assert {("staging", ".del-snap-9-aa"), ("staging", ".tmp-base-1"),
            ("snapshot", "broken")} <= whole


def test_the_fork_prefix_is_the_runtimes() -> None:
    assert cm.FORK_PREFIX == machine.FORK_PREFIX


def test_partial_image_writes_and_orphaned_build_snapshots(tmp_path: Path) -> None:
    cfg = Config(data_dir=tmp_path, instance="aenv")
    snaps = tmp_path / "snapshots"
    for d in ("buildcache-kept", "buildcache-orphan", "buildcache-template"):
        (snaps / d).mkdir(parents=True)
        (snaps / d / "manifest.json").write_text(json.dumps({"parent": None}))
    steps = tmp_path / "images" / "step-cache"
    steps.mkdir(parents=True)
    (steps / f"{'a' * 64}.json").write_text(json.dumps({"snapshot_id": "buildcache-kept"}))
    (tmp_path / "templates" / "t").mkdir(parents=True)
    (tmp_path / "templates" / "t" / "template.json").write_text(
        json.dumps({"snapshot_id": "buildcache-template"}))
    (tmp_path / "images" / "oci").mkdir()
    (tmp_path / "images" / "oci" / "oci-put-blob123").write_bytes(b"half a layer")
    (tmp_path / "images" / "contexts").mkdir()
    (tmp_path / "images" / "contexts" / ".tmp-abc-1234").write_bytes(b"half an upload")

    c = cm.census(cfg)
    got = {(r.kind, Path(r.name).name) for r in c.resources}
    assert {("buildsnap", "buildcache-orphan"), ("staging", "oci-put-blob123"),
            ("staging", ".tmp-abc-1234")} <= got  # fmt: skip
    assert not {n for k, n in got if n in ("buildcache-kept", "buildcache-template")}
    leaks = {Path(x.resource.name).name for x in cm.diff(c, live=[]).leaks}
    assert {"buildcache-orphan", "oci-put-blob123", ".tmp-abc-1234"} <= leaks
    assert cm.BUILD_PREFIX == stepgc.PREFIX
