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
from typing import Any

from aenv.config import Config, MachineShape
from aenv.images import eviction, finalize, layered, rootfs
from aenv.images.cache import CachedImage, ImageCache, layout_tag
from aenv.images.reference import parse
from aenv.images.registry import Credentials, RegistryError, RegistrySettings, Skopeo
from aenv.storage.snapshots import now_rfc3339
from aenv.storage.templates import Template, TemplateMissing

log = logging.getLogger(__name__)
LAYERED = "layered:"  # a template made on a lower one: its build key names that snapshot
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
    from aenv.machines.runtime import Runtime
    from aenv.orchestrator.builder import build_template

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
    if report.total > cfg.image_cache_bytes:
        progress(f"image cache: {report.total >> 20} MiB, over its bound of "
                 f"{cfg.image_cache_bytes >> 20} MiB (image_cache_bytes): the images templates "
                 f"were made from take {report.pinned >> 20} MiB")  # fmt: skip
    progress(f"image {pulled.manifest_digest} ({len(pulled.layers)} layers, "
             f"{pulled.size >> 20} MiB)")  # fmt: skip
    if name is None:  # a build's base: the template an image was exported from is that image
        same = exported_template(rt, cache, pulled.manifest_digest)
        if same is not None:
            progress(f"{ref} is template {same.name}'s own image: the build starts from it")
            return same
    # A build's base image (no name given) is a template named by its digest: shared by
    # every build FROM that image, and rebuilt by none.
    if name is None:
        size = shape or cfg.default_shape
        name = (f"image-{pulled.manifest_digest.removeprefix('sha256:')[:12]}-"
                f"{size.vcpus}c{size.memory_mib}m{size.disk_mib}d")  # fmt: skip
    source = f"{ref.name}:{ref.tag}@{pulled.digest}" if ref.tag else str(ref)
    with contextlib.suppress(TemplateMissing):  # its snapshot has another process running
        force = force or rt.catalog.get(name).start_cmd != start_cmd
    t = await _layered(rt, cache, pulled, name, source, shape or cfg.default_shape, force,
                       progress)  # fmt: skip
    if t is None:
        users: list[str | None] = []

        def fill(root: Path) -> None:
            progress(f"unpacking {len(pulled.layers)} layers")
            cache.unpack(pulled, root)
            rootfs.prepare(root, pulled.config.workdir)
            users.append(rootfs.user_name(root, pulled.config.user))  # uid -> name, here

        t = await build_template(rt, name, f"image-{pulled.manifest_digest}", shape,
                                 progress=progress, force=force, fill=fill)  # fmt: skip
        # No unpack when the rootfs was cached: the name then comes from the template before.
        t.user = users[0] if users else rootfs.user_name(Path("/nonexistent"),
                                                         pulled.config.user)  # fmt: skip
    t.source_image = source
    t.env = dict(pulled.config.env)
    t.workdir = pulled.config.workdir
    rt.catalog.put(t)
    if start_cmd and t.start_cmd != start_cmd:
        t = await finalize.with_start_cmd(rt, t, start_cmd, ready_cmd, progress)
    return t


def exported_template(rt: Any, cache: ImageCache, digest: str) -> Template | None:
    """The template image `digest` was exported from (`images.export`), as it was then."""
    for x in cache.local.all().values():
        if x.digest != digest:
            continue
        with contextlib.suppress(TemplateMissing):
            t: Template = rt.catalog.get(x.template)
            if (t.snapshot_id == x.snapshot_id and not t.start_cmd
                    and rt.has_snapshot(t.snapshot_id)):  # fmt: skip
                return t
    return None


async def _layered(rt: Any, cache: ImageCache, pulled: CachedImage, name: str, source: str,
                   shape: MachineShape, force: bool,
                   progress: Callable[[str], None]) -> Template | None:
    """The template made on a lower one (`layered`), or None: then the unpack path."""
    try:
        old: Template | None = rt.catalog.get(name)
    except TemplateMissing:
        old = None
    if (old is not None and not force and old.build_key.startswith(LAYERED)
            and old.source_image == source and old.shape == shape
            and rt.has_snapshot(old.snapshot_id)):  # fmt: skip
        progress(f"template {name} is up to date")
        return old
    if not rt.cfg.layered_pulls:
        return None
    lower = layered.find_lower(rt.catalog.list(), cache, pulled, shape, rt.has_snapshot)
    if lower is None:
        return None
    progress(f"{lower.layers} of its {len(pulled.layers)} layers are template "
             f"{lower.template.name}'s: making it on that one")  # fmt: skip
    try:
        snap, user = await layered.snapshot_on(rt, lower, pulled, cache, name, progress)
    except layered.LayeringFailed as e:
        raise RegistryError(f"applying {source}'s layers failed: {e}", "corrupt") from None
    t = Template(name=name, recipe=f"image-{pulled.manifest_digest}", shape=shape,
                 snapshot_id=snap, build_key=f"{LAYERED}{lower.template.snapshot_id}",
                 created_at=now_rfc3339(), envd_version=lower.template.envd_version, user=user)
    rt.catalog.put(t)
    if old is not None and old.snapshot_id != snap:
        with contextlib.suppress(Exception):
            rt.delete_snapshot(old.snapshot_id)
    progress(f"template {name} ready (snapshot {snap})")
    return t
