"""A hot pause's files made durable after its answer (`machines/durability.py`), on plain
files: the marker says so, a resume stops it being written again, and a marker of another
boot that never became durable is a lost paused state."""

from __future__ import annotations

import json
from pathlib import Path

from aenv.machines import durability
from aenv.machines.machine import PAUSE_MARKER
from aenv.storage.files import write_json_atomic


def _paused(d: Path) -> Path:
    for name in ("memory", "disk", "state"):
        (d / name).write_bytes(b"x" * 4096)
    write_json_atomic(d / PAUSE_MARKER, durability.marker(True, False))
    return d / PAUSE_MARKER


def test_a_marker_that_never_became_durable_is_lost_only_after_a_reboot() -> None:
    m = durability.marker(True, False)
    assert m["durable"] is False and m["boot"] == durability.boot_id()
    assert not durability.lost(m)
    assert durability.lost({**m, "boot": "another-boot"})
    assert not durability.lost(durability.marker(True, True))
    assert not durability.lost({"memory": True})  # written before markers said it


async def test_the_fsync_then_the_marker(tmp_path: Path) -> None:
    marker = _paused(tmp_path)
    d = durability.Durability()
    d.start("a", tmp_path)
    await d.wait("a")
    assert json.loads(marker.read_text()) == {"memory": True}


async def test_a_resume_meanwhile_keeps_the_marker_from_coming_back(tmp_path: Path) -> None:
    marker = _paused(tmp_path)
    d = durability.Durability()
    d.start("a", tmp_path)
    d.taken("a")
    marker.unlink()  # the resume's _forget_paused
    await d.close()
    assert not marker.exists()


def test_a_node_start_settles_what_an_earlier_process_left(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _paused(a)
    marker_b = _paused(b)
    write_json_atomic(marker_b, {**durability.marker(True, False), "boot": "another-boot"})
    durability.settle_all(tmp_path)
    assert json.loads((a / PAUSE_MARKER).read_text()) == {"memory": True}
    assert durability.lost(json.loads(marker_b.read_text()))  # not made whole after a reboot
