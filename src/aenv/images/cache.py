"""The node's image cache: one OCI image layout under `<data>/images/oci`, so every blob
(layer, config, manifest) is stored once, named by its digest, whichever images share it.

A pull asks the registry what the image is (its manifest digest and layer sizes), answers
from the cache when that digest is here, refuses before writing anything when the layers it
lacks would not fit, then has skopeo copy the image into the layout, fetching only the blobs
the layout lacks. skopeo writes each blob to a temporary file and renames it once its digest
checked, and names the image in `index.json` last, so a pull killed half-way leaves no entry
that looks complete. Pulls into the layout are serialised with a flock (index.json is one
file); different hosts' caches are separate.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv.images.local import LocalImages
from aenv.images.reference import Reference
from aenv.images.registry import Credentials, RegistryError, RemoteImage, Skopeo

REF_ANNOTATION = "org.opencontainers.image.ref.name"
UMOCI = "umoci"
UNPACK_TIMEOUT_S = 3600
# Unpacked layers take more room than their compressed blobs; what a pull must find free,
# per byte of blob it fetches (the blob, its unpacked files, the disk image made from them).
SPACE_FACTOR = 4


def umoci(*args: str, timeout: float = 600) -> None:
    try:
        p = subprocess.run([UMOCI, *args], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)  # fmt: skip
    except FileNotFoundError:
        raise RegistryError("umoci is not installed (scripts/install-host-deps.sh)",
                            "bad_config") from None  # fmt: skip
    if p.returncode != 0:
        raise RegistryError(f"umoci {args[0]} failed: {p.stderr.strip()[-300:]}", "corrupt")


class NoSpace(RegistryError):
    def __init__(self, message: str) -> None:
        super().__init__(message, "no_space")


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image's config that become sandbox defaults."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    @classmethod
    def from_blob(cls, blob: dict[str, Any]) -> ImageConfig:
        c = blob.get("config") or {}
        env = {}
        for item in c.get("Env") or []:
            k, sep, v = str(item).partition("=")
            if sep and k:
                env[k] = v
        return cls(env=env, workdir=c.get("WorkingDir") or None, user=c.get("User") or None,
                   entrypoint=list(c.get("Entrypoint") or []), cmd=list(c.get("Cmd") or []))


@dataclass(frozen=True)
class CachedImage:
    reference: Reference
    digest: str  # what the tag pointed at when pulled (manifest or index)
    manifest_digest: str  # the linux/amd64 manifest in the layout
    tag: str  # its name in the layout
    layers: tuple[str, ...]
    size: int  # bytes of its blobs
    config: ImageConfig


def layout_tag(digest: str) -> str:
    """The name an image is stored under in the layout: one per pulled digest."""
    return digest.replace(":", "-")


class ImageCache:
    def __init__(self, root: Path, skopeo: Skopeo) -> None:
        self.root = root
        self.layout = root / "oci"
        self.skopeo = skopeo
        self.local = LocalImages(root)
        root.mkdir(parents=True, exist_ok=True)

    # --- the layout -------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        algo, _, hexd = digest.partition(":")
        if algo != "sha256" or not re.fullmatch(r"[a-f0-9]{64}", hexd):
            raise RegistryError(f"unexpected digest {digest!r} in the image cache", "corrupt")
        return self.layout / "blobs" / algo / hexd

    def _blob_json(self, digest: str) -> dict[str, Any]:
        try:
            return json.loads(self.blob_path(digest).read_bytes())
        except (OSError, ValueError) as e:
            raise RegistryError(f"image cache blob {digest} is unreadable: {e}", "corrupt") from e

    def _index(self) -> list[dict[str, Any]]:
        try:
            return list(json.loads((self.layout / "index.json").read_text()).get("manifests", []))
        except FileNotFoundError:
            return []
        except ValueError as e:
            raise RegistryError(f"the image cache's index.json is corrupt: {e}", "corrupt") from e

    def find(self, ref: Reference, digest: str) -> CachedImage | None:
        tag = layout_tag(digest)
        for m in self._index():
            if (m.get("annotations") or {}).get(REF_ANNOTATION) == tag:
                manifest_digest = str(m["digest"])
                if not self.blob_path(manifest_digest).exists():
                    return None
                manifest = self._blob_json(manifest_digest)
                layers = tuple(str(x["digest"]) for x in manifest.get("layers") or [])
                if not all(self.blob_path(d).exists() for d in layers):
                    return None  # evicted layers: a pull fetches them again
                config_digest = str(manifest["config"]["digest"])
                size = sum(int(x.get("size") or 0) for x in manifest.get("layers") or [])
                return CachedImage(ref, digest, manifest_digest, tag, layers, size,
                                   ImageConfig.from_blob(self._blob_json(config_digest)))
        return None

    def cached_blobs(self) -> set[str]:
        d = self.layout / "blobs" / "sha256"
        return {f"sha256:{p.name}" for p in d.iterdir()} if d.is_dir() else set()

    def tags(self) -> dict[str, set[str]]:
        """Each image in the layout (by tag) and every blob it references."""
        out: dict[str, set[str]] = {}
        for m in self._index():
            tag = (m.get("annotations") or {}).get(REF_ANNOTATION)
            if not tag:
                continue
            blobs = {str(m["digest"])}
            with contextlib.suppress(RegistryError, KeyError, TypeError):
                manifest = self._blob_json(str(m["digest"]))
                blobs.add(str(manifest["config"]["digest"]))
                blobs |= {str(x["digest"]) for x in manifest.get("layers") or []}
            out[str(tag)] = blobs
        return out

    def layer_types(self, tag: str) -> list[tuple[str, str]] | None:
        """(digest, media type) of each layer of the image stored as `tag`, in order; None
        when the cache does not hold it whole."""
        for m in self._index():
            if (m.get("annotations") or {}).get(REF_ANNOTATION) == tag:
                with contextlib.suppress(RegistryError, KeyError, TypeError):
                    layers = self._blob_json(str(m["digest"])).get("layers") or []
                    out = [(str(x["digest"]), str(x.get("mediaType") or "")) for x in layers]
                    if all(self.blob_path(d).exists() for d, _ in out):
                        return out
        return None

    @contextmanager
    def locked(self) -> Iterator[None]:
        with (self.root / ".lock").open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # --- pull -------------------------------------------------------------------------------

    def _check_space(self, remote: RemoteImage, reserve_bytes: int) -> None:
        have = self.cached_blobs()
        missing = sum(layer.size for layer in remote.layers if layer.digest not in have)
        need = missing * SPACE_FACTOR + reserve_bytes
        free = shutil.disk_usage(self.root).free
        if need > free:
            raise NoSpace(f"{remote.reference} needs about {need >> 20} MiB free on the data "
                          f"filesystem ({missing >> 20} MiB of layers to fetch) and "
                          f"{free >> 20} MiB are free")  # fmt: skip

    def pull(self, ref: Reference, creds: Credentials | None = None, *, reserve_bytes: int = 0,
             on_line: Callable[[str], None] | None = None,
             admit: Callable[[RemoteImage], None] | None = None) -> CachedImage:
        """`admit` may refuse an image the cache lacks (its bound) before anything is
        written. A node-local image (`images.local`) is answered with no registry asked."""
        local = self.local.get(ref)
        if local is not None:
            cached = self.find(ref, local.digest)
            if cached is None:
                raise RegistryError(f"{ref} is an image of this node (exported from template "
                                    f"{local.template}) and its blobs are gone: `aenv setup` "
                                    "exports it again", "corrupt")  # fmt: skip
            return cached
        remote = self.skopeo.inspect(ref, creds)
        cached = self.find(ref, remote.digest)
        if cached is not None:
            return cached
        self._check_space(remote, reserve_bytes)
        if admit is not None:
            admit(remote)
        with self.locked():
            cached = self.find(ref, remote.digest)  # another pull may just have finished it
            if cached is None:
                self.skopeo.copy_to_layout(remote, self.layout, layout_tag(remote.digest),
                                           creds, on_line)  # fmt: skip
                cached = self.find(ref, remote.digest)
        if cached is None:
            raise RegistryError(f"skopeo copied {ref} but the cache does not hold it")
        return cached

    # --- unpack -----------------------------------------------------------------------------

    def unpack(self, image: CachedImage, dest: Path) -> None:
        """The image's layers applied in order into `dest` (which must not exist): umoci
        honours whiteouts, opaque directories, owners, modes, xattrs, hardlinks, symlinks and
        device nodes, and keeps every path inside `dest`."""
        with self.locked():  # a concurrent pull rewrites index.json
            try:
                p = subprocess.run([UMOCI, "raw", "unpack", "--image",
                                    f"{self.layout}:{image.tag}", str(dest)],
                                   capture_output=True, text=True, timeout=UNPACK_TIMEOUT_S,
                                   stdin=subprocess.DEVNULL)  # fmt: skip
            except FileNotFoundError:
                raise RegistryError("umoci is not installed (scripts/install-host-deps.sh)",
                                    "bad_config") from None  # fmt: skip
        if p.returncode != 0:
            msg = (p.stderr.strip().splitlines() or ["umoci failed"])[-1]
            raise RegistryError(f"unpacking {image.reference}: {msg}", "corrupt")
