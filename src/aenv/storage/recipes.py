"""The recipes `aenv setup -t NAME=RECIPE` makes templates from: a root filesystem made on
the host, and for some a start command running in the template's snapshot.

| recipe | what | shape |
|---|---|---|
| `debian` | minimal Debian (`base-minimal`) | node default |
| `familiar` | Debian with Python, Node.js, a toolchain (`base`) | node default |
| `busybox` | a static busybox alone | node default |
| `code-interpreter-v1` | E2B's code interpreter, its kernels warm | 2 vCPU, 2 GiB |
| `code-interpreter-minimal` | the same with the python kernel only | node default |
| `desktop` | E2B's desktop: Xvfb, xfce4, noVNC, Firefox; the desktop running | 2 vCPU, 2 GiB |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aenv.config import MachineShape
from aenv.storage import desktop_tree, interpreter_tree, rootfs

Make = Callable[[Path, Path, Callable[[str], None]], None]


@dataclass(frozen=True)
class Recipe:
    make: Make  # fills a directory with the root filesystem
    version: str  # changed when its output changes: its cached root filesystems go stale
    start_cmd: str | None = None  # running in the template's snapshot...
    ready_cmd: str | None = None  # ...once this succeeds
    start_user: str = "root"
    # E2B's shape for the code interpreter (2 vCPU, 2 GiB): a guest's memory is held only as
    # it is used, and idle memory goes back (density), so the larger shape costs what a
    # dataframe really takes. None: the node's default shape.
    shape: MachineShape | None = None


def _interpreter(make: Make, shape: MachineShape | None) -> Recipe:
    return Recipe(make, interpreter_tree.version(), interpreter_tree.START,
                  interpreter_tree.READY, shape=shape)  # fmt: skip


RECIPES: dict[str, Recipe] = {
    "debian": Recipe(rootfs.debian, "2"),  # 2: `python`
    "familiar": Recipe(rootfs.familiar, "1"),
    "busybox": Recipe(rootfs.busybox, "2"),
    "code-interpreter-v1": _interpreter(interpreter_tree.full,
                                        MachineShape(vcpus=2, memory_mib=2048)),
    "code-interpreter-minimal": _interpreter(interpreter_tree.minimal, None),
    "desktop": Recipe(desktop_tree.make, desktop_tree.version(), desktop_tree.START,
                      desktop_tree.READY, start_user="user",
                      shape=MachineShape(vcpus=2, memory_mib=2048)),
}
