"""The image cache under a small bound (AENV_IMAGE_CACHE_BYTES), with real templates and
sandboxes: eviction never breaks a running sandbox or a template; an image a template was made
from stays (pinned), and a pull that does not fit beside it is refused before anything is
written; an unpinned image is evicted (not the layers it shares), and pulled again by the next
pull that needs it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from e2b import Sandbox

from aenv import config
from aenv.images.cache import ImageCache, layout_tag
from aenv.images.reference import parse
from aenv.images.templates import image_cache
from tests.support.host import DATA_DIR
from tests.support.image_state import removed_after
from tests.support.registry import Seeded, have_tools

from .conftest import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")]

AENV = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "aenv")


def pull(ref: str, name: str, bound: int, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AENV_DATA_DIR": str(DATA_DIR), "AENV_IMAGE_CACHE_BYTES": str(bound),
           "AENV_LAYERED_PULLS": "0"}  # fmt: skip
    p = subprocess.run([AENV, "pull", ref, "--name", name], env=env, capture_output=True,
                       text=True, timeout=600, stdin=subprocess.DEVNULL)  # fmt: skip
    assert (p.returncode == 0) == ok, p.stderr
    return p


def _bytes(cache: ImageCache, tag: str) -> int:
    return sum(cache.blob_path(d).stat().st_blocks * 512 for d in cache.tags()[tag])


@pytest.mark.long  # ~75 s; the cache's own rules: unit tests
def test_eviction_keeps_sandboxes_and_templates_and_pulls_again(
        node: NodeProcess, seeded: Seeded) -> None:
    cache = image_cache(config.load())
    multi = cache.pull(parse(seeded.multi))
    bound = _bytes(cache, multi.tag)  # room for multi, not for a byte of sibling beside it
    tag = os.urandom(3).hex()
    a, b = f"e2e-evict-a-{tag}", f"e2e-evict-b-{tag}"
    with removed_after():
        pull(seeded.multi, a, bound)
        sbx = Sandbox.create(a, timeout=300)
        try:
            # multi is pinned (a template was made from it): sibling does not fit beside it,
            # and nothing is written.
            before = set(cache.tags())
            p = pull(seeded.sibling, b, bound, ok=False)
            assert "does not fit in the image cache" in p.stderr.strip().splitlines()[-1]
            assert set(cache.tags()) == before
            # Without its template multi is evictable: sibling's pull evicts it (not the base
            # layer the two share), and the cache is back under its bound.
            with node.api() as c:
                assert c.delete(f"/templates/{a}").status_code == 204
            p = pull(seeded.sibling, b, bound)
            assert "evicted 1 images" in p.stderr, p.stderr
            tags = cache.tags()
            assert multi.tag not in tags and multi.layers[0] in tags[layout_tag(
                cache.pull(parse(seeded.sibling)).digest)]  # fmt: skip
            assert sum(cache.blob_path(d).stat().st_blocks * 512
                       for d in cache.cached_blobs()) <= bound or len(tags) > 1
            # The sandbox of the deleted template and the template left both still work.
            assert sbx.commands.run("cat /opt/data/new").stdout == "new"
            other = Sandbox.create(b, timeout=120)
            try:
                assert other.commands.run("cat /sibling").stdout == "own"
            finally:
                other.kill()
        finally:
            sbx.kill()
        # A build FROM the evicted image fetches its own layer again (room made by removing
        # b's template first: the bound fits one image).
        with node.api() as c:
            assert c.delete(f"/templates/{b}").status_code == 204
        own = multi.layers[-1]
        gets = seeded.registry.blob_gets(own)
        p = pull(seeded.multi, f"{a}-again", bound)
        assert seeded.registry.blob_gets(own) == gets + 1, p.stderr
