"""Builds of one template name kept for their tags (storage/templates.py): Harbor builds one
per CPU/memory variant of an environment under one name, and E2B keeps every build."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv.config import MachineShape
from aenv.storage.templates import MAX_VERSIONS, Template, TemplateCatalog, TemplateMissing


def build(snap: str, tags: list[str], vcpus: int = 1) -> Template:
    return Template(name="env", recipe="build", shape=MachineShape(vcpus=vcpus, memory_mib=512),
                    snapshot_id=snap, build_key="k", created_at="t", tags=tags,
                    e2b_build_id=f"id-{snap}")  # fmt: skip


def test_a_variant_keeps_the_other_variants_tags() -> None:
    c1 = build("s1", ["c1-m512"], vcpus=1)
    c2 = build("s2", ["c2-m512"], vcpus=2)
    assert c1.succeed(c2) == []
    assert c2.version("c2-m512") is c2 and c2.version("") is c2 and c2.version("default") is c2
    v = c2.version("c1-m512")
    assert v is not None and v.snapshot_id == "s1" and v.shape.vcpus == 1
    assert c2.version("id-s1") is v  # its build id still names it
    assert c2.version("nope") is None


def test_a_build_that_takes_every_tag_replaces_the_last() -> None:
    a = build("s1", ["default"])
    b = build("s2", ["default"])
    assert a.succeed(b) == ["s1"]
    assert b.versions == [] and b.version("id-s1") is None


def test_tags_move_between_builds_and_an_untagged_build_goes() -> None:
    c1, c2 = build("s1", ["c1", "x"]), build("s2", ["c2"])
    c1.succeed(c2)
    assert c2.retag("c1", ["c2"]) == []  # c2 moves to the earlier build
    assert c2.tags == [] and c2.versions[0].tags == ["c1", "c2", "x"]
    assert c2.retag(None, ["c1", "c2", "x"]) == ["s1"]  # all back: the earlier one goes
    assert c2.versions == [] and c2.tags == ["c1", "c2", "x"]
    with pytest.raises(TemplateMissing):
        c2.retag("gone", ["y"])


def test_untag_drops_a_build_left_without_tags() -> None:
    c1, c2 = build("s1", ["c1"]), build("s2", ["c2"])
    c1.succeed(c2)
    assert c2.untag(["c1"]) == ["s1"] and c2.versions == []
    assert c2.untag(["c2"]) == [] and c2.tags == []  # the newest stays, untagged


def test_at_most_max_versions_kept_oldest_first_to_go() -> None:
    cur = build("s0", ["t0"])
    for i in range(1, MAX_VERSIONS + 3):
        new = build(f"s{i}", [f"t{i}"])
        gone = cur.succeed(new)
        cur = new
    assert len(cur.versions) == MAX_VERSIONS and gone == ["s1"]
    assert cur.versions[0].snapshot_id == f"s{MAX_VERSIONS + 1}"  # the newest first


def test_versions_round_trip_through_the_catalog(tmp_path: Path) -> None:
    cat = TemplateCatalog(tmp_path)
    c1, c2 = build("s1", ["c1"], vcpus=1), build("s2", ["c2"], vcpus=2)
    c1.succeed(c2)
    cat.put(c2)
    got = cat.get("env")
    v = got.version("c1")
    assert v is not None and v.shape == MachineShape(vcpus=1, memory_mib=512)
    assert got.to_json() == c2.to_json()
