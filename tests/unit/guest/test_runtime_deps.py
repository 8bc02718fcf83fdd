"""The agent must run from the tools drive: standard library + aenv.guest + the declared
RUNTIME_PACKAGES, nothing else (no aenv.config, no FastAPI...). Checked in a clean
``python3.11 -S`` with a path laid out like the tools drive."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import aenv.guest.agent
from aenv.guest.agent.runtime_deps import RUNTIME_PACKAGES
from tests.support.agent_ns import REPO, runtime_package_paths

PROBE = r"""
import json, sys
import aenv.guest.agent.server, aenv.guest.agent.app  # the whole agent
from aenv.guest.agent.options import AgentOptions
for http in ("auto", "h11"):  # the default parser and the pure-Python fallback
    aenv.guest.agent.server.make_server(object(), AgentOptions(http=http))
mods = sorted(sys.modules)
print(json.dumps({"modules": mods, "stdlib": sorted(sys.stdlib_module_names)}))
"""


def _stage(tmp_path: Path) -> Path:
    py = tmp_path / "py"
    (py / "aenv").mkdir(parents=True)
    (py / "aenv" / "__init__.py").write_text((REPO / "src/aenv/__init__.py").read_text())
    (py / "aenv" / "guest").symlink_to(REPO / "src/aenv/guest")
    for p in runtime_package_paths():
        (py / Path(p).name).symlink_to(p)
    return py


def test_agent_imports_only_stdlib_guest_and_declared_packages(tmp_path: Path) -> None:
    py = _stage(tmp_path)
    out = subprocess.run(
        ["/usr/bin/python3.11", "-S", "-c", PROBE],
        env={"PYTHONPATH": str(py), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    data = json.loads(out.stdout)
    stdlib = set(data["stdlib"])
    tops = {m.split(".")[0] for m in data["modules"]}
    # Cython-built extensions (httptools) register pseudo-modules that are not files.
    pseudo = {t for t in tops if t.startswith(("__", "_cython_")) or t == "cython_runtime"}
    foreign = tops - pseudo - stdlib - set(RUNTIME_PACKAGES) - {"aenv"}
    assert not foreign, f"undeclared imports: {sorted(foreign)}"
    unused = set(RUNTIME_PACKAGES) - tops
    assert not unused, f"declared but never imported: {sorted(unused)}"
    aenv_mods = [m for m in data["modules"] if m.split(".")[0] == "aenv"]
    assert all(m in ("aenv", "aenv.guest") or m.startswith("aenv.guest.") for m in aenv_mods)
    # The tools drive leaves these stdlib parts out.
    assert not tops & {"unittest", "sqlite3", "tkinter", "distutils", "lib2to3", "venv"}


def test_connectrpc_version_shim_matches_the_installed_package() -> None:
    assert importlib.metadata.version("connectrpc") == aenv.guest.agent.CONNECTRPC_VERSION


def test_version_constant() -> None:
    from aenv.guest.agent.version import ENVD_VERSION

    assert ENVD_VERSION == "0.6.4"
    assert sys.version_info[:2] == (3, 11)
