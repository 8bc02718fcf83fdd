"""An image pulled from a registry becomes a template: its layers unpacked into a root
filesystem (cached by the image's digest, so a second pull of the same image is a no-op),
the `user` account and a shell added, then the usual cold boot and snapshot. The image's
Env, WorkingDir and User become the template's sandbox defaults; its Entrypoint/Cmd is not
run (E2B takes a template's start command only from `startCmd`; `aenv pull --start-cmd`
gives one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from pathlib import Path

from aenv.config import Config, MachineShape
from aenv.images import eviction, finalize, rootfs
from aenv.images.cache import CachedImage, ImageCache, layout_tag
from aenv.images.reference import parse
from aenv.images.registry import Credentials, RegistrySettings, Skopeo
from aenv.storage.templates import Template, TemplateMissing

log = logging.getLogger(__name__)
_SKOPEO_BLOB = re.compile(r"Copying blob (sha256:[0-9a-f]{12})[0-9a-f]* ?(.*)")


def image_cache(cfg: Config) -> ImageCache:
    settings = RegistrySettings(
        mirrors=dict(cfg.registry.mirrors), insecure=list(cfg.registry.insecure),
        auth_file=cfg.registry.auth_file, ca_file=cfg.registry.ca_file,
        insecure_loopback=cfg.registry.insecure_loopback,
    )  # fmt: skip
    return ImageCache(cfg.images_dir, Skopeo(settings, cfg.run_dir / "skopeo"))


def pinned_tags(templates: list[Template]) -> set[str]:
    """The cached images templates were made from (`…@sha256:…` in their source)."""
    return {layout_tag(t.source_image.rsplit("@", 1)[1]) for t in templates
            if "@sha256:" in t.source_image}  # fmt: skip


def _skopeo_progress(progress: Callable[[str], None]) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        m = _SKOPEO_BLOB.match(line.strip())
        if m:
            progress(f"layer {m.group(1)}: {m.group(2) or 'fetching'}")

    return on_line


async def template_from_image(rt: object, image: str, name: str | None,
                              shape: MachineShape | None = None,
                              creds: Credentials | None = None, start_cmd: str | None = None,
                              progress: Callable[[str], None] = print,
                              force: bool = False, ready_cmd: str | None = None) -> Template:
    """Pull `image` and build template `name` from it. `rt` is the node's Runtime. With
    `start_cmd`, the template is snapshotted with it running (`finalize`)."""
    from aenv.orchestrator.builder import build_template
    from aenv.orchestrator.runtime import Runtime

    assert isinstance(rt, Runtime)
    cfg = rt.cfg
    ref = parse(image)
    cache = image_cache(cfg)
    progress(f"pulling {ref}")
    pinned = pinned_tags(rt.catalog.list())
    pulled: CachedImage = await asyncio.to_thread(
        cache.pull, ref, creds, reserve_bytes=cfg.disk_reserve_mib << 20,
        on_line=_skopeo_progress(progress),
        admit=lambda remote: eviction.check_room(cache, remote, cfg.image_cache_bytes, pinned),
    )  # fmt: skip
    eviction.touch(cache, pulled.tag)
    report = await asyncio.to_thread(eviction.evict, cache, cfg.image_cache_bytes,
                                     pinned | {pulled.tag})
    if report.evicted:
        progress(f"image cache: evicted {len(report.evicted)} images no template needs")
    progress(f"image {pulled.manifest_digest} ({len(pulled.layers)} layers, "
             f"{pulled.size >> 20} MiB)")  # fmt: skip
    # A build's base image (no name given) is a template named by its digest: shared by
    # every build FROM that image, and rebuilt by none.
    if name is None:
        size = shape or cfg.default_shape
        name = (f"image-{pulled.manifest_digest.removeprefix('sha256:')[:12]}-"
                f"{size.vcpus}c{size.memory_mib}m{size.disk_mib}d")  # fmt: skip
    users: list[str | None] = []

    def fill(root: Path) -> None:
        progress(f"unpacking {len(pulled.layers)} layers")
        cache.unpack(pulled, root)
        rootfs.prepare(root, pulled.config.workdir)
        users.append(rootfs.user_name(root, pulled.config.user))  # uid -> name, while here

    with contextlib.suppress(TemplateMissing):  # its snapshot has another process running
        force = force or rt.catalog.get(name).start_cmd != start_cmd
    t = await build_template(rt, name, f"image-{pulled.manifest_digest}", shape,
                             progress=progress, force=force, fill=fill)  # fmt: skip
    # No unpack when the rootfs was cached: the name then comes from the template before.
    user = users[0] if users else rootfs.user_name(Path("/nonexistent"), pulled.config.user)
    t.source_image = f"{ref.name}:{ref.tag}@{pulled.digest}" if ref.tag else str(ref)
    t.env = dict(pulled.config.env)
    t.user = user
    t.workdir = pulled.config.workdir
    rt.catalog.put(t)
    if start_cmd and t.start_cmd != start_cmd:
        t = await finalize.with_start_cmd(rt, t, start_cmd, ready_cmd, progress)
    return t
