"""Pulls from a real registry (Debian's docker-registry on loopback) into the image cache,
with images built offline by umoci: layer semantics, the shared blob cache, mirrors, and
every failure leaving the cache as it was."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv.images.cache import ImageCache, NoSpace
from aenv.images.reference import parse
from aenv.images.registry import RegistryError, RegistrySettings, Skopeo
from tests.support.registry import Seeded, have_tools, seeded_registry

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


def test_a_mirror_serves_docker_hub_names(seeded: Seeded, tmp_path: Path) -> None:
    cache = _cache(tmp_path, mirrors={"docker.io": [f"http://{seeded.registry.host}"]})
    image = cache.pull(parse("ubuntu:22.04"))
    assert str(image.reference) == "docker.io/library/ubuntu:22.04"
    assert image.config.env == {"FOO": "bar"}


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
        assert f"sha256:{victim}" not in cache.cached_blobs()
        assert cache.find(parse(seeded.multi), remote.digest) is None
    finally:
        data.write_bytes(good)
