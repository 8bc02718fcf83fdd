"""A template's disk exported as a node-local image (images.export): real ext4, real mount,
tar and umoci into a real image cache layout. A pull of a local name asks no registry (the
cache's skopeo points at nothing), unpacks to the same tree, and eviction never drops it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aenv.images import eviction
from aenv.images.cache import ImageCache
from aenv.images.export import ExportConfig, export
from aenv.images.reference import parse
from aenv.images.registry import RegistryError, RegistrySettings, Skopeo
from aenv.storage.rootfs import make_ext4
from tests.support.registry import busybox_tree, have_tools

pytestmark = pytest.mark.skipif(have_tools() is not None or os.geteuid() != 0,
                                reason=have_tools() or "mounting needs root")  # fmt: skip


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    root = busybox_tree(tmp_path / "tree")
    (root / "srv").mkdir()
    (root / "srv/data").write_text("exported")
    os.chown(root / "srv/data", 1000, 1000)
    (root / "tmp/scratch").write_text("run-time state: left out")
    image = tmp_path / "disk.ext4"
    make_ext4(root, image, 64, tmp_path / "mkfs.log")
    return image


def _cache(tmp_path: Path) -> ImageCache:
    # No mirrors, no registry: a pull that reached skopeo would fail.
    return ImageCache(tmp_path / "images", Skopeo(RegistrySettings(), tmp_path / "skopeo"))


def test_export_pulls_offline_and_unpacks_the_same_tree(disk: Path, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    refs = [parse("e2bdev/base"), parse("localhost/aenv/base")]
    before = disk.read_bytes()
    digest = export(cache, disk, refs, ExportConfig({"PATH": "/bin"}, "user", "/home/user"),
                    "base", "snap-1")  # fmt: skip
    assert disk.read_bytes() == before  # the template's disk is never mounted itself
    for ref in refs:
        image = cache.pull(ref)
        assert image.manifest_digest == digest
        assert (image.config.env, image.config.user, image.config.workdir) == (
            {"PATH": "/bin"}, "user", "/home/user")
    root = tmp_path / "root"
    cache.unpack(cache.pull(refs[0]), root)
    assert (root / "srv/data").read_text() == "exported"
    assert (root / "srv/data").stat().st_uid == 1000
    assert (root / "bin/busybox").exists()
    assert not (root / "lost+found").exists() and not (root / "tmp/scratch").exists()
    assert not list(Path(cache.root).glob(".export-*"))  # its work files are gone
    # Not a local name: the registry is asked (and there is none).
    with pytest.raises(RegistryError):
        cache.pull(parse("127.0.0.1:9/nothing/here"))


def test_local_images_are_never_evicted(disk: Path, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    export(cache, disk, [parse("localhost/aenv/base-minimal")], ExportConfig(), "b", "s")
    report = eviction.evict(cache, 0, set())
    assert report.evicted == []
    assert cache.pull(parse("localhost/aenv/base-minimal")).layers


def test_local_image_with_lost_blobs_is_a_clear_error(disk: Path, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    ref = parse("localhost/aenv/base-minimal")
    export(cache, disk, [ref], ExportConfig(), "base", "snap-1")
    for layer in cache.pull(ref).layers:
        cache.blob_path(layer).unlink()
    with pytest.raises(RegistryError, match="exported from template base.*aenv setup"):
        cache.pull(ref)


def test_export_of_a_missing_disk_leaves_nothing(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    with pytest.raises(OSError):
        export(cache, tmp_path / "nope.ext4", [parse("localhost/x")], ExportConfig(), "x", "s")
    assert cache.local.all() == {}
    assert not list(Path(cache.root).glob(".export-*"))
