"""A template's root filesystem exported as an OCI image into the node's image cache, under
node-local names (`images.local`): how the minimal Debian and the familiar base become images
a Dockerfile can start `FROM`, offline, and how the familiar base stands in for `e2bdev/base`.

The template's snapshot disk is reflink-cloned (the snapshot stays untouched), the clone is
mounted (its journal replayed there), and its tree becomes one layer: tar writes it, umoci
adds it to a new image in the cache's layout and sets the config (Env, User, WorkingDir).
The image is stored under its manifest digest as a pulled image is, and the names point at
it. A template made from that image later (a build `FROM` it) is the exported template
itself: `images.templates` finds it by the digest in its `source_image`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aenv.images.cache import ImageCache, layout_tag, umoci
from aenv.images.local import LocalImage
from aenv.images.reference import Reference
from aenv.images.registry import RegistryError
from aenv.storage.files import clone

EXPORT_TIMEOUT_S = 1800
# Run-time state and the ext4 root's own directory are not part of an image.
EXCLUDE = ("./lost+found", "./tmp/*", "./run/*", "./var/cache/apt/archives/*.deb")


@dataclass(frozen=True)
class ExportConfig:
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None


def _run(argv: list[str], what: str) -> None:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S,
                       stdin=subprocess.DEVNULL)  # fmt: skip
    if p.returncode != 0:
        raise RegistryError(f"{what} failed: {p.stderr.strip()[-300:]}", "corrupt")


@contextlib.contextmanager
def _mounted(disk: Path, work: Path) -> Iterator[Path]:
    """The disk's clone, mounted read-write (its journal is replayed on the clone only)."""
    copy, mnt = work / "disk", work / "mnt"
    clone(disk, copy)
    mnt.mkdir()
    _run(["mount", "-o", "loop,nodev,nosuid", str(copy), str(mnt)], f"mounting {disk}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-d", str(mnt)], capture_output=True, check=False)


def _manifest_digest(cache: ImageCache, tag: str) -> str:
    index = json.loads((cache.layout / "index.json").read_text())
    for m in index.get("manifests", []):
        if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag:
            return str(m["digest"])
    raise RegistryError(f"umoci made no image {tag} in the image cache", "corrupt")


def export(cache: ImageCache, disk: Path, refs: list[Reference], config: ExportConfig,
           template: str, snapshot_id: str) -> str:
    """Export `disk` (a template snapshot's) as `refs`; returns the manifest digest."""
    if not refs:
        raise ValueError("an export needs at least one name")
    with tempfile.TemporaryDirectory(dir=cache.root, prefix=".export-") as tmp:
        work = Path(tmp)
        layer = work / "layer.tar"
        with _mounted(disk, work) as root:
            _run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "--acls",
                  *(f"--exclude={x}" for x in EXCLUDE), "-C", str(root), "-cf", str(layer),
                  "."], f"archiving {template}'s root filesystem")  # fmt: skip
        with cache.locked():
            image = f"{cache.layout}:aenv-export-{secrets.token_hex(4)}"
            if not (cache.layout / "index.json").exists():
                umoci("init", "--layout", str(cache.layout))
            umoci("new", "--image", image)
            try:
                umoci("raw", "add-layer", "--image", image, str(layer),
                      timeout=EXPORT_TIMEOUT_S)  # fmt: skip
                args = [f"--config.env={k}={v}" for k, v in sorted(config.env.items())]
                if config.user:
                    args.append(f"--config.user={config.user}")
                if config.workdir:
                    args.append(f"--config.workingdir={config.workdir}")
                umoci("config", "--image", image, "--config.cmd=/bin/bash",
                      f"--history.created_by=aenv export of template {template}", *args)
                digest = _manifest_digest(cache, image.rsplit(":", 1)[1])
                if cache.find(refs[0], digest) is None:
                    umoci("tag", "--image", image, layout_tag(digest))
            finally:
                umoci("rm", "--image", image)
            cache.local.put(refs, LocalImage(digest, template, snapshot_id))
    return digest
