"""Whether a snapshot taken on one node may restore on another, and with which files there.

A snapshot's RAM holds the kernel it booted and the tools drive it mounted, and its device
state is QEMU's: a node restores it only with the same QEMU version, the same kernel (by
content) and the same tools drive (by its cache key, which names its content), under the
same accelerator, and under KVM on the same CPU model. The kernel and the tools drive are
then this node's own files of that content, wherever it keeps them.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

from aenv.config import Config
from aenv.machines.api import RuntimeError_
from aenv.store.published import Compat

TOOLS_FILE = "tools.ext4"  # artifacts/tools/<key>/tools.ext4 (storage/tools.py)
KERNEL_FILE = "bzImage"  # artifacts/kernel/<key>/bzImage (storage/kernel.py)


class Incompatible(RuntimeError_):
    """The snapshot cannot restore on this node; the message says why."""

    status = 409


@functools.cache
def qemu_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.splitlines()[0].strip() if out.stdout else ""


@functools.cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


@functools.cache
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's sha256, hashed once per (path, size, mtime) in this process."""
    st = path.stat()
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


def tools_id(path: Path) -> str:
    """A tools drive's identity: its cache key (the directory it is built in), which is
    derived from everything that goes into it; else its content."""
    return path.parent.name if path.name == TOOLS_FILE else file_sha256(path)


def node_compat(cfg: Config, accel: str | None) -> Compat:
    """This node's side (its kernel and tools are looked for per snapshot: `local_files`)."""
    return Compat(qemu=qemu_version(cfg.qemu_binary), accel=accel,
                  cpu=cpu_model() if accel == "kvm" else None)  # fmt: skip


def snapshot_compat(cfg: Config, kernel: Path, tools: Path, accel: str | None) -> Compat:
    """What a snapshot taken here with `kernel` and `tools` needs of a node."""
    return node_compat(cfg, accel).model_copy(
        update={"kernel": file_sha256(kernel), "tools": tools_id(tools)})


def local_files(cfg: Config, want: Compat, accel: str | None) -> tuple[Path, Path]:
    """This node's kernel and tools drive for a snapshot that needs `want`; Incompatible
    if the node differs or has no such files."""
    why = want.mismatch(node_compat(cfg, accel))
    if why is not None:
        raise Incompatible(why)
    kernels = [*([cfg.kernel_path] if cfg.kernel_path else []),
               *sorted((cfg.artifacts_dir / "kernel").glob(f"*/{KERNEL_FILE}"))]  # fmt: skip
    kernel = next((k for k in kernels if k.is_file() and file_sha256(k) == want.kernel), None)
    if kernel is None:
        raise Incompatible(f"the kernel it was taken with (sha256 {want.kernel[:12]}) is not "
                           "on this node")  # fmt: skip
    tools = cfg.artifacts_dir / "tools" / want.tools / TOOLS_FILE
    if not tools.is_file():
        raise Incompatible(f"the tools drive it was taken with ({want.tools}) is not on this "
                           "node")  # fmt: skip
    return kernel, tools
