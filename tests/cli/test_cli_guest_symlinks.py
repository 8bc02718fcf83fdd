"""`aenv download` against a hostile sandbox: the names and symlinks in a downloaded
directory come from the guest, and must never make the CLI write outside the destination."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import Node

pytestmark = [pytest.mark.vm, pytest.mark.timeout(180)]


def test_a_guest_symlink_never_redirects_a_download(vm_node: Node, sandbox: str,
                                                    tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    # First the guest offers a symlink to a host directory: it is recreated as a link.
    p = vm_node.cli("exec", sandbox, f"rm -rf /tmp/trap && mkdir -p /tmp/trap && "
                                     f"ln -s {outside} /tmp/trap/esc && echo x > /tmp/trap/f")
    assert p.returncode == 0, p.stderr
    p = vm_node.cli("download", sandbox, "/tmp/trap", str(out))
    assert p.returncode == 0, p.stderr
    assert os.readlink(out / "trap" / "esc") == str(outside)
    # Then the same name is a directory with a file in it: downloading again into the same
    # place must not write through the link left by the first download.
    p = vm_node.cli("exec", sandbox, "rm /tmp/trap/esc && mkdir /tmp/trap/esc && "
                                     "echo pwned > /tmp/trap/esc/planted && "
                                     "ln -s /nonexistent /tmp/trap/f2")
    assert p.returncode == 0, p.stderr
    p = vm_node.cli("download", sandbox, "/tmp/trap", str(out))
    assert p.returncode != 0 and "outside" in p.stderr, (p.returncode, p.stderr)
    assert list(outside.iterdir()) == []

    # A symlink in the destination at a file's own name is not followed either.
    (out / "trap2").mkdir()
    victim = outside / "victim"
    victim.write_text("mine")
    (out / "trap2" / "f").symlink_to(victim)
    p = vm_node.cli("exec", sandbox, "rm -rf /tmp/trap2 && mkdir /tmp/trap2 && "
                                     "echo guest > /tmp/trap2/f")
    assert p.returncode == 0, p.stderr
    p = vm_node.cli("download", sandbox, "/tmp/trap2", str(out))
    assert p.returncode != 0, p.stderr
    assert victim.read_text() == "mine"
