"""The kernels the server starts, as Jupyter kernel specs it writes itself into a directory
put first on the kernels' search path (`JUPYTER_PATH`). A template installs wheels and npm
packages without running their install code, so no package writes a spec of its own; a
spec is written for each kernel whose runtime is there.

| spec | language | runs |
|---|---|---|
| `python3` | python | ipykernel, in the server's Python |
| `bash` | bash | bash_kernel, in the server's Python |
| `javascript` | javascript | `deno jupyter --kernel` (PyPI `deno`) |
| `typescript` | typescript | the same, its own context |
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Spec:
    language: str
    argv: list[str]
    module: str = ""  # a Python module it needs in the server's Python
    command: str = ""  # or a command on PATH
    env: dict[str, str] = field(default_factory=dict)

    def present(self) -> bool:
        if self.module:
            return importlib.util.find_spec(self.module) is not None
        return shutil.which(self.command) is not None


def _specs() -> dict[str, Spec]:
    py = sys.executable
    # Deno (PyPI `deno`: one binary beside the server's Python) runs JavaScript and TypeScript.
    deno = shutil.which("deno", path=str(Path(py).parent)) or "deno"
    plain = {"NO_COLOR": "1"}  # results as plain text, not ANSI-coloured
    return {
        "python3": Spec("python", [py, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                        module="ipykernel"),
        "bash": Spec("bash", [py, "-m", "bash_kernel", "-f", "{connection_file}"],
                     module="bash_kernel", env={"PS1": "$"}),
        "javascript": Spec("javascript", [deno, "jupyter", "--kernel", "--conn",
                                          "{connection_file}"], command=deno, env=plain),
        "typescript": Spec("typescript", [deno, "jupyter", "--kernel", "--conn",
                                          "{connection_file}"], command=deno, env=plain),
    }  # fmt: skip


def install(state_dir: Path) -> list[str]:
    """Write the specs whose runtimes are present under `state_dir`/kernels and put it first
    on this process's JUPYTER_PATH (kernel managers look there); the specs' names."""
    kernels = state_dir / "kernels"
    written = []
    for name, spec in _specs().items():
        d = kernels / name
        if not spec.present():
            shutil.rmtree(d, ignore_errors=True)
            continue
        d.mkdir(parents=True, exist_ok=True)
        (d / "kernel.json").write_text(json.dumps({
            "argv": spec.argv, "display_name": name, "language": spec.language,
            "env": spec.env}, indent=1))  # fmt: skip
        written.append(name)
    rest = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(state_dir) + (os.pathsep + rest if rest else "")
    return written
