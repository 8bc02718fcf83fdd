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
SETTLE_BYTES = 8 << 20
SETTLE_ENV = "AENV_SETTLE"
# One guest process does it all (each Python start dirties RAM the snapshot keeps): apply the
# layers in order, removing each file once applied, prepare the tree as a pull does, give the
# freed blocks back to the host (FITRIM; the disk is discard=unmap), print the User's account.
APPLY = f"""
import fcntl, os, struct, sys, time
sys.path.insert(0, {WORK!r})
from pathlib import Path
import apply_layer, rootfs
workdir, user, layers = sys.argv[1] or None, sys.argv[2] or None, sys.argv[3:]
for i, layer in enumerate(layers, 1):
    n = apply_layer.apply(Path(layer), Path("/"))
    os.unlink(layer)
    print(f"layer {{i}}/{{len(layers)}}: {{n}} entries", flush=True)
rootfs.prepare(Path("/"), workdir)
account = rootfs.user_name(Path("/"), user) or ""
os.sync()
fd = os.open("/", os.O_RDONLY)
try:
    fcntl.ioctl(fd, 0xC0185879, struct.pack("QQQ", 0, 2**64 - 1, 0))
except OSError:
    pass
if {SETTLE_ENV!r} in os.environ:
    # Large layers: drop the page cache (the layers' files are on disk now) and give free
    # page reporting time to hand the freed RAM back, so the snapshot does not keep it.
    order = Path("/sys/module/page_reporting/parameters/page_reporting_order")
    was = order.read_text() if order.exists() else None
    if was is not None:
        order.write_text("4")  # report 64 KiB free runs too, not only 4 MiB ones
    Path("/proc/sys/vm/drop_caches").write_text("1")
    time.sleep(3)
    if was is not None:
        order.write_text(was)
print("user=" + account)
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
    # A template exported as an image (images.export) holds that image's tree as well.
    exported = {(x.template, x.snapshot_id) for x in cache.local.all().values()}
    for t in templates:
        from_image = t.recipe.startswith("image-") or (t.name, t.snapshot_id) in exported
        if t.start_cmd or t.shape != shape or not from_image or "@sha256:" not in t.source_image:
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
    from aenv.machines.api import AgentInit

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
            paths = []
            for i, digest in enumerate(extra, 1):
                progress(f"layer {digest[:19]}: copying into a VM of {lower.template.name}")
                paths.append(f"{WORK}/layer{i}")
                await agent.write(paths[-1], cache.blob_path(digest))
            out: list[str] = []
            q = shlex.quote
            settle = f"{SETTLE_ENV}=1 " if sum(
                cache.blob_path(d).stat().st_size for d in extra) > SETTLE_BYTES else ""
            await _run(agent, f"{settle}{GUEST_PYTHON} -c {q(APPLY)} "
                              f"{q(image.config.workdir or '')} "
                              f"{q(image.config.user or '')} {' '.join(paths)} && rm -rf {WORK}",
                       out)  # fmt: skip
            for line in out[:-1]:
                progress(line)
        finally:
            await agent.close()
        await rt.snapshot_build(vm, snap, name)
    finally:
        await rt.destroy(vm)
    user = out[-1].removeprefix("user=").strip() if out and out[-1].startswith("user=") else ""
    return snap, user or None
