"""Build contexts: the tar archives the SDK uploads for COPY steps, stored once by their
files hash, checked before any reaches a build VM.

The SDK PUTs an archive to the URL `GET /templates/{id}/files/{hash}` answered, with no API
key: the URL carries its own short-lived signature (an HMAC of the hash and an expiry under a
key of this node process). An archive is written to a temporary name and renamed when whole,
so one cut off half-way is never `present`.

Archives are kept after their build: a rebuild of the same files skips the upload (the SDK
asks whether the hash is `present` first). They are bounded in all (`build_contexts_bytes`):
after each build the least recently used go first (`evict`), but never one a build in
flight names, nor one used within `KEEP_RECENT_S` (its build may not have started yet).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import posixpath
import re
import secrets
import tarfile
import time
from pathlib import Path

UPLOAD_PREFIX = "/_aenv/build-files/"
URL_TTL_S = 3600
HASH_RE = re.compile(r"[a-f0-9]{64}")
GZIP_MAGIC = b"\x1f\x8b"
KEEP_RECENT_S = URL_TTL_S  # an upload is kept at least as long as its URL was valid


class ContextError(ValueError):
    """An archive that cannot be used: the message says which member and why."""


class ContextStore:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._key = secrets.token_bytes(32)
        root.mkdir(parents=True, exist_ok=True)

    def path(self, files_hash: str) -> Path:
        if not HASH_RE.fullmatch(files_hash):
            raise ContextError(f"{files_hash!r} is not a files hash (64 hex digits)")
        return self.root / files_hash

    def present(self, files_hash: str) -> bool:
        """Whether the archive is here; asking counts as a use (the SDK asks before each
        build that copies it)."""
        return self.touch(files_hash)

    def touch(self, files_hash: str) -> bool:
        """Mark the archive used now (least recently used goes first); False if absent."""
        try:
            os.utime(self.path(files_hash))
        except FileNotFoundError:
            return False
        return True

    def evict(self, bound: int, in_use: set[str]) -> list[str]:
        """Remove archives, least recently used first, until all left fit in `bound` bytes;
        none in `in_use` or used within KEEP_RECENT_S. The hashes removed."""
        kept: list[tuple[float, int, Path]] = []
        for p in self.root.iterdir():
            if not HASH_RE.fullmatch(p.name):
                continue  # uploads in progress (.tmp-*) are the census's
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            kept.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in kept)
        gone: list[str] = []
        recent = time.time() - KEEP_RECENT_S
        for mtime, size, p in sorted(kept):
            if total <= bound:
                break
            if p.name in in_use or mtime > recent:
                continue
            p.unlink(missing_ok=True)
            total -= size
            gone.append(p.name)
        return gone

    def _mac(self, files_hash: str, exp: int) -> str:
        return hmac.new(self._key, f"{files_hash}:{exp}".encode(), hashlib.sha256).hexdigest()

    def upload_path(self, files_hash: str) -> str:
        """Path and query of a signed upload URL for `files_hash`."""
        exp = int(time.time()) + URL_TTL_S
        return f"{UPLOAD_PREFIX}{files_hash}?exp={exp}&sig={self._mac(files_hash, exp)}"

    def verify(self, files_hash: str, exp: str, sig: str) -> bool:
        try:
            when = int(exp)
        except ValueError:
            return False
        return when >= time.time() and hmac.compare_digest(self._mac(files_hash, when), sig)

    def staging(self, files_hash: str) -> Path:
        return self.root / f".tmp-{files_hash}-{secrets.token_hex(4)}"

    def commit(self, staged: Path, files_hash: str) -> None:
        check_archive(staged)
        os.replace(staged, self.path(files_hash))


def is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == GZIP_MAGIC


def check_archive(path: Path) -> None:
    """Every member stays inside the directory it is extracted to: relative names without
    `..`, nothing written through a symlink the archive made, hardlinks to earlier members
    only, no devices. Symlinks themselves may point anywhere: they are copied as links."""
    links: set[str] = set()
    seen: set[str] = set()
    try:
        with tarfile.open(path, "r:*") as tar:
            for m in tar:
                name = posixpath.normpath(m.name)
                if m.name.startswith("/") or name == ".." or name.startswith("../"):
                    raise ContextError(f"{m.name!r} leaves the build context")
                parts = name.split("/")
                for i in range(1, len(parts)):
                    if "/".join(parts[:i]) in links:
                        raise ContextError(f"{m.name!r} would be written through the symlink "
                                           f"{'/'.join(parts[:i])!r}")  # fmt: skip
                if m.isdev() or m.isfifo():
                    raise ContextError(f"{m.name!r} is a device or fifo: not copied")
                if m.islnk():
                    target = posixpath.normpath(m.linkname)
                    if target not in seen:
                        raise ContextError(f"hardlink {m.name!r} -> {m.linkname!r} names no "
                                           "earlier member")  # fmt: skip
                if m.issym():
                    links.add(name)
                seen.add(name)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ContextError(f"the build context is not a readable tar archive: {e}") from None
