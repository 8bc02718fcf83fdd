"""Whether a snapshot may restore on a node, and with which of its files (store/compat.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv.config import Config
from aenv.store.compat import Incompatible, local_files, snapshot_compat


def _artifacts(root: Path, kernel: bytes, tools_key: str) -> tuple[Path, Path]:
    k = root / "artifacts" / "kernel" / "k1" / "bzImage"
    t = root / "artifacts" / "tools" / tools_key / "tools.ext4"
    for p, data in ((k, kernel), (t, b"tools")):
        p.parent.mkdir(parents=True)
        p.write_bytes(data)
    return k, t


def test_the_same_content_is_found_wherever_the_node_keeps_it(tmp_path: Path) -> None:
    here = Config(data_dir=tmp_path / "a")
    k, t = _artifacts(here.data_dir, b"kernel-1", "tools-abc")
    want = snapshot_compat(here, k, t, "tcg")
    assert want.tools == "tools-abc" and len(want.kernel) == 64
    there = Config(data_dir=tmp_path / "b")
    k2, t2 = _artifacts(there.data_dir, b"kernel-1", "tools-abc")
    assert local_files(there, want, "tcg") == (k2, t2)


@pytest.mark.parametrize(("kernel", "tools", "accel", "why"), [
    (b"kernel-2", "tools-abc", "tcg", "kernel it was taken with"),
    (b"kernel-1", "tools-new", "tcg", r"tools drive it was taken with \(tools-abc\)"),
    (b"kernel-1", "tools-abc", "kvm", "accel differs"),
])  # fmt: skip
def test_a_node_that_differs_refuses_with_the_reason(
    tmp_path: Path, kernel: bytes, tools: str, accel: str, why: str
) -> None:
    here = Config(data_dir=tmp_path / "a")
    want = snapshot_compat(here, *_artifacts(here.data_dir, b"kernel-1", "tools-abc"), "tcg")
    there = Config(data_dir=tmp_path / "b")
    _artifacts(there.data_dir, kernel, tools)
    with pytest.raises(Incompatible, match=why) as e:
        local_files(there, want, accel)
    assert e.value.status == 409
