"""The tools drive: a read-only ext4 image with the guest init, a static busybox, and the
agent with its own Python runtime (Debian's python3.11, its stdlib, the shared libraries it
loads and its own dynamic loader), precompiled, so the agent runs in any user rootfs.

Cached by a hash of everything that goes into it.
"""

from __future__ import annotations

import compileall
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import aenv.guest
from aenv.storage.rootfs import BUSYBOX, RootfsError, make_ext4

GUEST_PYTHON = Path("/usr/bin/python3.11")
GUEST_STDLIB = Path("/usr/lib/python3.11")
_STDLIB_SKIP = {
    "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
    "distutils", "unittest", "config-3.11-x86_64-linux-gnu", "__pycache__", "site-packages",
    "dist-packages", "venv", "sqlite3",
}


def _runtime_packages() -> tuple[str, ...]:
    try:
        from aenv.guest.agent.runtime_deps import RUNTIME_PACKAGES
    except ImportError:
        return ()
    return tuple(RUNTIME_PACKAGES)


def _package_dirs(names: Iterable[str]) -> list[Path]:
    out = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise RootfsError(f"agent runtime package {name!r} is not installed in the venv")
        origin = Path(spec.origin)
        out.append(origin.parent if origin.name == "__init__.py" else origin)
    return out


def _dist_infos(names: Iterable[str]) -> set[Path]:
    by_module = importlib.metadata.packages_distributions()
    out = set()
    for name in names:
        for dist_name in by_module.get(name, []):
            path = getattr(importlib.metadata.distribution(dist_name), "_path", None)
            if path is not None:
                out.add(Path(path))
    return out


def _guest_dir() -> Path:
    return Path(aenv.guest.__file__).parent


def tools_key() -> str:
    """The hash of everything that goes into the tools drive: its directory name."""
    h = hashlib.sha256()
    roots = [_guest_dir(), *_package_dirs(_runtime_packages())]
    for root in roots:
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
        for p in files:
            h.update(str(p.relative_to(root.parent)).encode())
            h.update(p.read_bytes())
    for p in (GUEST_PYTHON, BUSYBOX):
        st = p.stat()
        h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(b"v2")
    return h.hexdigest()[:16]


def _ldd(paths: Iterable[Path]) -> set[Path]:
    libs: set[Path] = set()
    for p in paths:
        r = subprocess.run(["ldd", str(p)], capture_output=True, text=True)
        for m in re.finditer(r"(/\S+\.so[\w.\-]*)", r.stdout):
            libs.add(Path(m.group(1)))
    return libs


def build_exec_helper(out: Path) -> Path:
    """Compile the guest's static ``aenv-exec`` (agent/spawn.py says why it exists)."""
    src = _guest_dir() / "aenv-exec.c"
    r = subprocess.run(
        ["gcc", "-static", "-s", "-O2", "-Wall", "-Werror", "-o", str(out), str(src)],
        capture_output=True, text=True,
    )
    if r.returncode != 0:
        raise RootfsError(f"building aenv-exec failed: {r.stderr.strip()[-500:]}")
    return out


def _stage(root: Path) -> None:
    guest = _guest_dir()
    shutil.copy2(guest / "init.sh", root / "init")
    (root / "init").chmod(0o755)
    shutil.copy2(guest / "init-stage2.sh", root / "init-stage2")
    (root / "bin").mkdir()
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    build_exec_helper(root / "bin/aenv-exec")
    (root / "rootfs").mkdir()
    for d in ("proc", "sys", "dev"):
        (root / d).mkdir()

    py = root / "python"
    (py / "bin").mkdir(parents=True)
    shutil.copy2(GUEST_PYTHON, py / "bin/python3")
    stdlib = py / "lib/python3.11"
    shutil.copytree(
        GUEST_STDLIB, stdlib, symlinks=False,
        ignore=lambda d, names: [n for n in names if n in _STDLIB_SKIP],
    )
    site = stdlib / "site-packages"
    site.mkdir()
    pkg = site / "aenv"
    pkg.mkdir()
    shutil.copy2(Path(aenv.__file__), pkg / "__init__.py")
    shutil.copytree(
        guest, pkg / "guest", ignore=shutil.ignore_patterns("__pycache__", "*.sh", "*.c")
    )
    for src in _package_dirs(_runtime_packages()):
        if src.is_dir():
            shutil.copytree(src, site / src.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, site / src.name)
    # Packages may read their own metadata (importlib.metadata.version) at import time.
    for dist_info in _dist_infos(_runtime_packages()):
        shutil.copytree(dist_info, site / dist_info.name, dirs_exist_ok=True)

    sos = [GUEST_PYTHON, *py.rglob("*.so")]
    lib = root / "lib"
    lib.mkdir()
    for so in _ldd(sos):
        shutil.copy2(so, lib / so.name)
    if not (lib / "ld-linux-x86-64.so.2").exists():
        raise RootfsError("ldd did not report ld-linux-x86-64.so.2 for python3.11")
    # The guest's filesystem is read-only: precompile with unchecked hashes so the agent
    # never stats sources to validate its .pyc files.
    ok = compileall.compile_dir(
        str(py / "lib"), quiet=1, workers=os.cpu_count() or 1,
        invalidation_mode=compileall.py_compile.PycInvalidationMode.UNCHECKED_HASH,
        ddir="/.aenv/python/lib",
    )
    if not ok:
        raise RootfsError("compiling the agent's Python files failed")


def ensure_tools(artifacts_dir: Path, log: Callable[[str], None] = print) -> Path:
    """Return the path of the tools drive image, building it if its inputs changed."""
    key = tools_key()
    final = artifacts_dir / "tools" / key / "tools.ext4"
    if final.exists():
        return final
    if not GUEST_PYTHON.exists():
        raise RootfsError(f"{GUEST_PYTHON} is missing (Debian package python3.11)")
    final.parent.parent.mkdir(parents=True, exist_ok=True)
    log(f"building tools drive {key}")
    with tempfile.TemporaryDirectory(dir=final.parent.parent, prefix="tmp-") as tmp:
        root = Path(tmp, "root")
        root.mkdir()
        _stage(root)
        size_kib = int(subprocess.run(["du", "-sk", str(root)], capture_output=True,
                                      text=True).stdout.split()[0])
        img = Path(tmp, "tools.ext4")
        make_ext4(root, img, size_mib=size_kib * 13 // 10 // 1024 + 16, log_file=Path(tmp, "log"))
        img.chmod(0o444)
        Path(tmp, "out").mkdir()
        os.replace(img, Path(tmp, "out", "tools.ext4"))
        os.replace(Path(tmp, "out"), final.parent)
    log(f"tools drive ready: {final}")
    return final

