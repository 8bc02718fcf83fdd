"""Pulls from a real registry (Debian's docker-registry on loopback) into the image cache,
with images built offline by umoci: layer semantics, the shared blob cache, mirrors, and
every failure leaving the cache as it was."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv.images import eviction
from aenv.images.cache import ImageCache, NoSpace
from aenv.images.reference import parse
from aenv.images.registry import RegistryError, RegistrySettings, Skopeo
from tests.support.registry import (
    DroppingProxy,
    OciImage,
    Registry,
    Seeded,
    busybox_tree,
    have_tools,
    seeded_registry,
)

pytestmark = pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    with seeded_registry(tmp_path_factory.mktemp("registry")) as s:
        yield s


def _cache(tmp_path: Path, **settings: object) -> ImageCache:
    skopeo = Skopeo(RegistrySettings(**settings), tmp_path / "skopeo")  # type: ignore[arg-type]
    return ImageCache(tmp_path / "images", skopeo)


def _state(cache: ImageCache) -> tuple[set[str], str]:
    index = cache.layout / "index.json"
    return cache.cached_blobs(), index.read_text() if index.exists() else ""


def test_layers_unpack_with_whiteouts_opaque_dirs_links_modes_xattrs_and_owners(
        seeded: Seeded, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    image = cache.pull(parse(seeded.multi))
    assert len(image.layers) == 3
    assert image.config.env == {"FOO": "bar"}
    assert (image.config.workdir, image.config.user) == ("/work", "1000")
    root = tmp_path / "root"
    cache.unpack(image, root)
    assert not (root / "etc/gone").exists()
    assert sorted(os.listdir(root / "opt/data")) == ["new"]
    a, b = (root / "srv/a").stat(), (root / "srv/b").stat()
    assert a.st_ino == b.st_ino and a.st_nlink == 2
    assert (a.st_uid, a.st_gid) == (123, 456)
    assert (root / "srv/suid").stat().st_mode & 0o7777 == 0o4755
    assert os.getxattr(root / "srv/x", "user.aenv") == b"ok"
    assert os.readlink(root / "srv/link") == "/etc/passwd"  # kept as is, not followed


def test_blobs_are_shared_and_never_fetched_twice(seeded: Seeded, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    first = cache.pull(parse(seeded.multi))
    lines: list[str] = []
    again = cache.pull(parse(seeded.multi), on_line=lines.append)
    assert again == first and lines == []  # answered from the cache: no copy at all
    base = first.layers[0]
    st = cache.blob_path(base).stat()
    gets = seeded.registry.blob_gets(base)
    sibling = cache.pull(parse(seeded.sibling), on_line=lines.append)
    assert set(first.layers) & set(sibling.layers) == {base}, "built on one base layer"
    assert seeded.registry.blob_gets(base) == gets, "the shared layer was fetched again"
    assert seeded.registry.blob_gets(sibling.layers[-1]) >= 1
    again_st = cache.blob_path(base).stat()
    assert (again_st.st_ino, again_st.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert cache.cached_blobs() >= set(first.layers) | set(sibling.layers)


def test_a_manifest_list_resolves_to_linux_amd64(seeded: Seeded, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    multi = cache.pull(parse(seeded.multi))
    image = cache.pull(parse(seeded.multiarch))
    assert image.manifest_digest == multi.manifest_digest != image.digest  # the amd64 entry
    assert image.layers == multi.layers and image.config == multi.config
    with pytest.raises(RegistryError) as e:
        cache.pull(parse(seeded.arm_only))
    assert e.value.kind == "not_found" and "no linux/amd64 image" in str(e.value)
    assert "linux/arm64" in str(e.value)


def test_a_mirror_serves_docker_hub_names(seeded: Seeded, tmp_path: Path) -> None:
    cache = _cache(tmp_path, mirrors={"docker.io": [f"http://{seeded.registry.host}"]})
    image = cache.pull(parse("ubuntu:22.04"))
    assert str(image.reference) == "docker.io/library/ubuntu:22.04"
    assert image.layers == cache.pull(parse(seeded.sibling)).layers
    assert cache.pull(parse("e2bdev/base")).layers == image.layers


def test_failures_say_which_and_leave_the_cache_as_it_was(seeded: Seeded, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    cache.pull(parse(seeded.sibling))
    before = _state(cache)
    cases = {
        "not_found": f"{seeded.registry.host}/test/multi:no-such-tag",
        "unreachable": "127.0.0.1:1/test/multi:1",
    }
    for kind, ref in cases.items():
        with pytest.raises(RegistryError) as e:
            cache.pull(parse(ref))
        assert e.value.kind == kind, str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(NoSpace) as e:
        cache.pull(parse(seeded.multi), reserve_bytes=1 << 60)
    assert "MiB" in str(e.value)
    assert _state(cache) == before


def test_a_blob_whose_digest_does_not_match_is_refused(seeded: Seeded, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    remote = cache.skopeo.inspect(parse(seeded.multi))
    # The registry serves what its storage holds: flip the bytes of one layer there.
    victim = remote.layers[-1].digest.removeprefix("sha256:")
    data = next(p for p in seeded.registry.blob_files() if p.parent.name == victim)
    good = data.read_bytes()
    try:
        data.write_bytes(good[:-16] + bytes(16))
        with pytest.raises(RegistryError) as e:
            cache.pull(parse(seeded.multi))
        assert e.value.kind == "corrupt", str(e.value)
        assert f"sha256:{victim}" not in cache.cached_blobs(), (str(e.value), _state(cache))
        assert cache.find(parse(seeded.multi), remote.digest) is None, _state(cache)
    finally:
        data.write_bytes(good)


def test_the_bound_evicts_what_no_template_needs(seeded: Seeded, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    a = cache.pull(parse(seeded.multi))
    eviction.touch(cache, a.tag)
    b = cache.pull(parse(seeded.sibling))
    eviction.touch(cache, b.tag)
    tags = cache.tags()
    a_bytes = sum(cache.blob_path(d).stat().st_blocks * 512 for d in tags[a.tag])
    # Room for `a` alone, and `a` pinned (a template was made from it): `b` goes, but not
    # the base layer the two share.
    report = eviction.evict(cache, a_bytes, {a.tag})
    assert report.evicted == [b.tag] and report.total <= a_bytes
    assert cache.find(b.reference, b.digest) is None
    assert cache.find(a.reference, a.digest) == a
    assert set(a.layers) <= cache.cached_blobs()
    # An evicted image is pulled again when needed; its shared layer is not fetched again.
    gets = seeded.registry.blob_gets(b.layers[-1])
    assert cache.pull(parse(seeded.sibling)) == b
    assert seeded.registry.blob_gets(b.layers[-1]) == gets + 1
    assert seeded.registry.blob_gets(a.layers[0]) >= 1
    # Pinned images alone over the bound: said, and a pull that does not fit is refused
    # before anything is written.
    small = a_bytes // 2
    report = eviction.evict(cache, small, {a.tag, b.tag})
    assert report.evicted == [] and report.total == report.pinned > small
    eviction.evict(cache, a_bytes, {a.tag})
    before = _state(cache)
    with pytest.raises(NoSpace) as e:
        cache.pull(parse(seeded.sibling), admit=lambda remote: eviction.check_room(
            cache, remote, a_bytes, {a.tag}))
    assert e.value.kind == "no_space" and "image_cache_bytes" in str(e.value)
    assert _state(cache) == before


def test_zstd_and_uncompressed_layers_are_stored_as_gzip_and_unpack(tmp_path: Path) -> None:
    """Registries serve zstd and plain-tar layers too: the cache keeps every layer as gzip
    (what umoci 0.4 and the guest's tarfile read), each checked against its digest first."""
    reg = Registry(tmp_path / "registry").start()
    try:
        img = OciImage(tmp_path / "layout", "c")
        img.layer(busybox_tree)
        img.layer(lambda r: (r / "hello").write_text("compressed either way"))
        refs = [img.push_zstd(reg, "test/zstd:1"), img.push_uncompressed(reg, "test/plain:1")]
        cache = _cache(tmp_path)
        for ref in refs:
            remote = cache.skopeo.inspect(parse(ref))
            got = cache.pull(parse(ref))
            assert [x.digest for x in remote.layers] != list(got.layers)  # recompressed
            assert {t for _, t in cache.layer_types(got.tag) or []} == {
                "application/vnd.oci.image.layer.v1.tar+gzip"}
            root = tmp_path / f"root-{got.tag}"
            cache.unpack(got, root)
            assert (root / "hello").read_text() == "compressed either way"
    finally:
        reg.stop()


def test_a_dropped_download_is_retried_and_checked(seeded: Seeded, tmp_path: Path) -> None:
    """The registry's answer is cut in the middle of a layer: skopeo retries the blob (from its
    start: Debian's skopeo 1.9 does not resume with Range requests), the digest check passes,
    and the cache holds the image whole."""
    proxy = DroppingProxy(seeded.registry.host, after=256 << 10)
    try:
        ref = seeded.multi.replace(seeded.registry.host, proxy.host)
        cache = _cache(tmp_path)
        big = max(cache.skopeo.inspect(parse(ref)).layers, key=lambda x: x.size)
        assert big.size > 256 << 10
        before = seeded.registry.blob_gets(big.digest)
        got = cache.pull(parse(ref))
        assert proxy.dropped == 1
        assert seeded.registry.blob_gets(big.digest) >= before + 2  # cut, then again
        assert big.digest in got.layers and cache.find(parse(ref), got.digest) == got
    finally:
        proxy.close()
