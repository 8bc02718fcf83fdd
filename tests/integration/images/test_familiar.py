"""The familiar base's inputs (images/familiar.py), without building it: the Dockerfile is one
the unmodified E2B SDK turns into a build (FROM the node-local minimal image, COPY of the
packages, RUN apt-get), and the host's apt resolves the packages against the minimal
template's own dpkg status, read off its snapshot disk. The build itself: `make run`, and
bench/base.py for its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2b import Template

from aenv.images import familiar
from aenv.storage.snapshots import SnapshotStore
from aenv.storage.templates import TemplateCatalog, TemplateMissing
from tests.support.host import DATA_DIR


def test_the_dockerfile_is_a_build_the_sdk_sends(tmp_path: Path) -> None:
    (tmp_path / "debs").mkdir()
    (tmp_path / "debs/x_1_all.deb").write_bytes(b"!<arch>\n")
    familiar.write_context(tmp_path)
    t = Template(file_context_path=str(tmp_path)).from_dockerfile(str(tmp_path / "Dockerfile"))
    spec = json.loads(Template.to_json(t))
    assert spec["fromImage"] == "localhost/aenv/base-minimal:latest"
    steps = [(s["type"], s["args"][0]) for s in spec["steps"]]
    assert ("COPY", "debs/") in steps
    run = next(a for k, a in steps if k == "RUN")
    assert run.startswith("apt-get install") and "/tmp/aenv-debs/*.deb" in run
    assert steps[-2:] == [("USER", "user"), ("WORKDIR", "/home/user")]


def _minimal_disk() -> Path:
    catalog, store = TemplateCatalog(DATA_DIR / "templates"), SnapshotStore(DATA_DIR / "snapshots")
    for name in ("base-minimal", "base"):  # `base` is the minimal one under --minimal-base
        try:
            t = catalog.get(name)
        except TemplateMissing:
            continue
        if t.recipe == "debian":
            return store.file(t.snapshot_id, "disk")
    pytest.skip("no minimal Debian template here: run `aenv setup` first")


def test_packages_resolve_against_the_minimal_images_own_status(tmp_path: Path) -> None:
    debs = familiar.resolve_packages(_minimal_disk(), tmp_path)
    names = {d.split("_", 1)[0] for d in debs}
    assert {"nodejs", "npm", "python3-pip", "gcc-12", "make"} <= names
    # What the minimal image holds already is not fetched again.
    assert not names & {"bash", "coreutils", "python3", "git", "curl"}
    assert all(d.endswith(".deb") for d in debs)
    assert familiar.build_key("snap", debs) != familiar.build_key("snap2", debs)


def test_a_disk_that_is_not_debian_is_a_clear_error(tmp_path: Path) -> None:
    from aenv.storage.rootfs import make_ext4

    (tmp_path / "root/etc").mkdir(parents=True)
    make_ext4(tmp_path / "root", tmp_path / "disk", 16, tmp_path / "log")
    with pytest.raises(familiar.FamiliarError, match="dpkg status"):
        familiar.resolve_packages(tmp_path / "disk", tmp_path)
