"""A pulled image whose layers extend those of an image a template was made from becomes a
template made on that one: a VM of the lower template applies the extra layers in place
(`apply_layer`, with the tools drive's Python), prepares the tree as a pull does
(`rootfs.prepare`, the same code, run in the guest), and its snapshot is the new template.
Its disk and RAM are then reflink clones of the lower template's plus what the layers wrote,
and making it needs no unpack, no mkfs and no cold boot. Images of one base (one image per
task, as SWE-bench-style suites ship) thus share the base's bytes on the data filesystem.

Only layers Python's tarfile reads go this way (gzip or plain tar): an image with zstd layers
beyond the lower one's takes the unpack path.
"""

from __future__ import annotations

import logging
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aenv.config import MachineShape
from aenv.images import apply_layer, rootfs
from aenv.images.agent import AgentError, BuildAgent
from aenv.images.cache import CachedImage, ImageCache, layout_tag

log = logging.getLogger(__name__)
GUEST_PYTHON = ("PYTHONHOME=/.aenv/python /.aenv/lib/ld-linux-x86-64.so.2 "
                "--library-path /.aenv/lib /.aenv/python/bin/python3")  # fmt: skip
WORK = "/.aenv-layers"  # on the guest's disk (its RAM stays free), root only; removed after
_OCI, _DOCKER = "application/vnd.oci.image.layer.v1", "application/vnd.docker.image.rootfs.diff"
READABLE = frozenset({f"{_OCI}.tar", f"{_OCI}.tar+gzip", f"{_DOCKER}.tar", f"{_DOCKER}.tar.gzip"})
# Beyond this many layer bytes, the guest's page cache is dropped before the snapshot and the
# freed pages given back (free page reporting): the snapshot keeps less of the layers' RAM.
SETTLE_BYTES = 16 << 20
PREPARE = f"""
import sys
sys.path.insert(0, {WORK!r})
from pathlib import Path
import rootfs
rootfs.prepare(Path("/"), sys.argv[1] or None)
print(rootfs.user_name(Path("/"), sys.argv[2] or None) or "")
"""
# FITRIM on the root: the blocks the layer files took go back to the host (discard=unmap).
TRIM = """
import fcntl, os, struct
fd = os.open("/", os.O_RDONLY)
try:
    fcntl.ioctl(fd, 0xC0185879, struct.pack("QQQ", 0, 2**64 - 1, 0))
except OSError:
    pass
"""


class LayeringFailed(Exception):
    pass


@dataclass(frozen=True)
class Lower:
    template: Any  # storage.templates.Template
    layers: int  # how many of the image's layers it already holds


def find_lower(templates: list[Any], cache: ImageCache, image: CachedImage,
               shape: MachineShape, has_snapshot: Callable[[str], bool]) -> Lower | None:
    """The template whose image's layers are the longest proper prefix of `image`'s, of the
    same machine shape, with no start command of its own (its processes are not the image's)."""
    mine = cache.layer_types(image.tag)
    if mine is None:
        return None
    best: Lower | None = None
    for t in templates:
        if (t.start_cmd or t.shape != shape or not t.recipe.startswith("image-")
                or "@sha256:" not in t.source_image):  # fmt: skip
            continue
        lower = cache.layer_types(layout_tag(t.source_image.rsplit("@", 1)[1]))
        n = len(lower or [])
        if not lower or n >= len(mine) or [d for d, _ in lower] != [d for d, _ in mine[:n]]:
            continue
        if any(media not in READABLE for _, media in mine[n:]):
            continue
        if (best is None or n > best.layers) and has_snapshot(t.snapshot_id):
            best = Lower(t, n)
    return best


async def _run(agent: BuildAgent, cmd: str, out: list[str] | None = None) -> None:
    lines: list[str] = [] if out is None else out
    try:
        code = await agent.run(cmd, user="root", cwd="/", on_line=lines.append)
    except AgentError as e:
        raise LayeringFailed(f"the build VM's agent failed: {e}") from None
    if code != 0:
        raise LayeringFailed(f"exit code {code}: {' | '.join(lines[-5:])}")


async def snapshot_on(rt: Any, lower: Lower, image: CachedImage, cache: ImageCache,
                      name: str, progress: Callable[[str], None]) -> tuple[str, str | None]:
    """Apply `image`'s extra layers in a VM of `lower` and snapshot it for template `name`:
    (the snapshot id, the account the image's User names)."""
    from aenv.orchestrator.runtime_api import AgentInit

    token, vm = secrets.token_hex(16), f"build-{secrets.token_hex(4)}"
    handle = await rt.create(vm, lower.template.name, AgentInit(
        access_token=token, default_user="root", default_workdir="/"))  # fmt: skip
    snap = f"tpl-{name}-{secrets.token_hex(4)}"
    try:
        agent = BuildAgent(handle.url(), token)
        try:
            await _run(agent, f"rm -rf {WORK} && mkdir -m 700 {WORK}")
            for mod in (apply_layer, rootfs):
                assert mod.__file__ is not None
                await agent.write(f"{WORK}/{mod.__name__.rsplit('.', 1)[1]}.py",
                                  Path(mod.__file__).read_bytes())  # fmt: skip
            extra = image.layers[lower.layers:]
            size = 0
            for i, digest in enumerate(extra, 1):
                blob = cache.blob_path(digest)
                size += blob.stat().st_size
                progress(f"layer {digest[:19]}: applying ({i}/{len(extra)}) in a VM of "
                         f"{lower.template.name}")  # fmt: skip
                await agent.write(f"{WORK}/layer{i}", blob)
                await _run(agent, f"{GUEST_PYTHON} {WORK}/apply_layer.py {WORK}/layer{i} / "
                                  f"&& rm {WORK}/layer{i}")  # fmt: skip
            out: list[str] = []
            q = shlex.quote
            await _run(agent, f"{GUEST_PYTHON} -c {q(PREPARE)} "
                              f"{q(image.config.workdir or '')} {q(image.config.user or '')}",
                       out)  # fmt: skip
            settle = "; echo 3 > /proc/sys/vm/drop_caches; sleep 3" if size > SETTLE_BYTES else ""
            await _run(agent, f"rm -rf {WORK}; sync; {GUEST_PYTHON} -c {q(TRIM)}{settle}")
        finally:
            await agent.close()
        await rt.snapshot_build(vm, snap, name)
    finally:
        await rt.destroy(vm)
    return snap, (out[-1].strip() or None) if out else None
