"""The trainer's side ships alone (`clients/aenv-rl`): the wheel holds the client and the
adapters and nothing of the node, and those modules import nothing of the node."""

from __future__ import annotations

import ast
import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CLIENT_MODULES = ["aenv/rl/__init__.py", "aenv/rl/client.py", "aenv/rl/gym.py",
                  "aenv/integrations/__init__.py", "aenv/integrations/harbor.py",
                  "aenv/integrations/nemo_gym.py", "aenv/integrations/skyrl.py",
                  "aenv/integrations/verl.py"]  # fmt: skip
ALLOWED = ("aenv.rl.client", "aenv.rl.gym", "aenv.rl")


def test_client_modules_import_nothing_of_the_node() -> None:
    for rel in CLIENT_MODULES:
        tree = ast.parse((ROOT / "src" / rel).read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name == "aenv" or name.startswith("aenv."):
                    assert name in ALLOWED, f"{rel} imports {name}: not in the client wheel"


def test_the_wheel_holds_exactly_the_client(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / ".uv/bin/uv"), "build", "--wheel", "-q",
                    str(ROOT / "clients/aenv-rl"), "-o", str(tmp_path)], check=True)  # fmt: skip
    (wheel,) = tmp_path.glob("aenv_rl-*.whl")
    z = zipfile.ZipFile(wheel)
    names = {n for n in z.namelist() if not n.startswith("aenv_rl-")}
    assert names == set(CLIENT_MODULES)
    # NeMo Gym finds the provider by its entry point.
    (eps,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "[nemo_gym.sandbox_providers]\naenv = aenv.integrations.nemo_gym:AenvProvider" in \
        z.read(eps).decode()
