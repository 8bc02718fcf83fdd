"""One image layer applied in place onto a root filesystem, as an overlay of it would look:
a whiteout (`.wh.NAME`) removes what the layers below had, an opaque directory
(`.wh..wh..opq`) hides all of it, and every other entry is extracted with its numeric owner,
mode (setuid included), xattrs (PAX `SCHILY.xattr.*`), and as a hard link, symlink or device
node where it is one. An entry replaces what was at its path, except that a directory stays
a directory (its contents merge).

It runs inside a build VM, with the tools drive's Python (stdlib only: the image may have
none), so nothing a layer holds ever touches the host: `python3 apply_layer.py LAYER [ROOT]`
(gzip or plain tar). Paths are taken as the guest sees them, inside ROOT (default `/`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
from pathlib import Path, PurePosixPath

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
XATTR = "SCHILY.xattr."


# Layers may hold device nodes and absolute symlinks: no extraction filter (Python >= 3.12
# warns without one and 3.14 would apply "data"); the guest is the boundary here.
_TRUSTED = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}


class LayerError(Exception):
    pass


def _relative(name: str) -> PurePosixPath | None:
    """A member's path inside the root (None for the root itself); `..` is refused."""
    parts = [p for p in PurePosixPath(name).parts if p not in ("/", ".", "")]
    if ".." in parts:
        raise LayerError(f"layer entry {name!r} leaves the root")
    return PurePosixPath(*parts) if parts else None


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def _members(tf: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Every member. Some writers (umoci's insert, Go's archive/tar unclosed) end a layer
    without the last block's padding and the end-of-archive blocks, which Docker and umoci
    accept: so does this, when the last member's data is whole."""
    out: list[tarfile.TarInfo] = []
    while True:
        try:
            m = tf.next()
        except tarfile.ReadError as e:
            last = out[-1] if out else None
            if str(e) != "unexpected end of data" or last is None:
                raise
            data = tf.extractfile(last) if last.isreg() else None
            if data is not None and len(data.read()) != last.size:
                raise
            return out
        if m is None:
            return out
        out.append(m)


def apply(layer: Path, root: Path) -> int:
    """Apply `layer` onto `root`; returns the number of entries extracted."""
    with tarfile.open(layer, "r:*") as tf:
        keep: list[tuple[tarfile.TarInfo, PurePosixPath]] = []
        for m in _members(tf):
            rel = _relative(m.name)
            if rel is None:
                continue
            parent = root / rel.parent
            if rel.name == OPAQUE:
                if parent.is_dir() and not parent.is_symlink():
                    for child in parent.iterdir():
                        _remove(child)
            elif rel.name.startswith(WHITEOUT):
                _remove(parent / rel.name[len(WHITEOUT):])
            else:
                keep.append((m, rel))
        for m, rel in keep:
            target = root / rel
            if target.is_symlink() or (target.exists() and not (m.isdir() and target.is_dir())):
                _remove(target)
            m.name = str(rel)
            # A hard link shares its target's inode: its header's owner and mode are not its own.
            tf.extract(m, root, set_attrs=not m.islnk(), numeric_owner=True, **_TRUSTED)
            for key, value in m.pax_headers.items():
                if key.startswith(XATTR):
                    os.setxattr(target, key[len(XATTR):],
                                value.encode("utf-8", "surrogateescape"),
                                follow_symlinks=False)  # fmt: skip
        return len(keep)


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        n = apply(Path(argv[0]), Path(argv[1] if len(argv) > 1 else "/"))
    except (LayerError, OSError, tarfile.TarError) as e:
        print(f"applying {argv[0]} failed: {e}", file=sys.stderr)
        return 1
    print(f"{n} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
