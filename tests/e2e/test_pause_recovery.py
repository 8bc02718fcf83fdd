"""Paused sandboxes and snapshots across node restarts: AENV_ON_SHUTDOWN=pause, and kill -9
of the node in the middle of a pause, a fork and a snapshot. Nothing kept is lost (paused
sandboxes, finished snapshots stay resumable/usable); nothing is leaked (VMMs, transient fork
snapshots, half-written snapshots, directories)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState

from .conftest import (
    DATA_DIR,
    NodeProcess,
    qemu_pids,
    start_node,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _start(tmp_path: Path, label: str, instance: str, monkeypatch: pytest.MonkeyPatch,
           **env: str) -> NodeProcess:
    return start_node(tmp_path / f"{label}.log", instance, monkeypatch, **env)


def _in_background(fn: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(Exception):  # the node dies under it
            fn()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _listed() -> dict[str, SandboxState]:
    return {s.sandbox_id: s.state for s in Sandbox.list().next_items()}


def _snapshot_dirs() -> set[str]:
    return {p.name for p in (DATA_DIR / "snapshots").iterdir()}


def _cleanup(node: NodeProcess, snapshots: list[str]) -> None:
    for sid in _listed():
        Sandbox.kill(sid)
    for s in snapshots:
        Sandbox.delete_snapshot(s)
    assert node.stop() == 0, node.tail()


def test_shutdown_pauses_then_restart_and_kill_9_mid_pause(
    tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _start(tmp_path, "a", instance, monkeypatch, AENV_ON_SHUTDOWN="pause")
    try:
        s1 = Sandbox.create(timeout=300)
        bg = s1.commands.run("sleep 600", background=True, timeout=0)
        s1.files.write("f.txt", "one")
        s2 = Sandbox.create(timeout=300)
        s2.files.write("f.txt", "two")
        assert s2.pause() is True
    finally:
        code = a.stop()  # SIGTERM: s1 is paused, not killed
    assert code == 0, a.tail()
    assert not qemu_pids(instance), "a paused sandbox still has a VMM"

    b = _start(tmp_path, "b", instance, monkeypatch)
    try:
        paused = SandboxQuery(state=[SandboxState.PAUSED])
        assert {s.sandbox_id for s in Sandbox.list(query=paused).next_items()} == {
            s1.sandbox_id, s2.sandbox_id}
        r1 = Sandbox.connect(s1.sandbox_id)
        assert r1.files.read("f.txt") == "one"
        assert bg.pid in [p.pid for p in r1.commands.list()]
        # kill -9 of the node while it pauses s1
        t = _in_background(lambda: Sandbox.pause(s1.sandbox_id))
        time.sleep(0.05)
    finally:
        b.kill9()
    t.join(30)

    c = _start(tmp_path, "c", instance, monkeypatch)
    try:
        listed = _listed()
        # s2 was paused before: intact. s1 is paused if its pause reached the disk, else its
        # VM, which outlived the node, is re-adopted and runs on (the pause is undone).
        assert listed == {s2.sandbox_id: SandboxState.PAUSED,
                          s1.sandbox_id: listed.get(s1.sandbox_id)}
        assert listed[s1.sandbox_id] in (SandboxState.PAUSED, SandboxState.RUNNING)
        assert Sandbox.connect(s2.sandbox_id).files.read("f.txt") == "two"
        assert Sandbox.connect(s1.sandbox_id).files.read("f.txt") == "one"
    finally:
        _cleanup(c, [])


def test_kill_9_mid_fork_and_mid_snapshot(
    tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _start(tmp_path, "a", instance, monkeypatch)
    try:
        keep = Sandbox.create(timeout=300)
        keep.files.write("f.txt", "kept")
        snap = keep.create_snapshot()
        assert keep.pause() is True
        src = Sandbox.create(timeout=300)
        t = _in_background(lambda: src.fork(count=4))
        time.sleep(0.5)  # the fork takes seconds: its snapshot is taken, children restore
    finally:
        a.kill9()
    t.join(30)

    b = _start(tmp_path, "b", instance, monkeypatch)
    snaps = [snap.snapshot_id]
    try:
        # kept: the paused sandbox and the snapshot. The source's VM outlived the node: it is
        # re-adopted and runs on. A child is removed unless the fork had finished it (then
        # it is Running and re-adopted too).
        listed = _listed()
        assert listed.pop(keep.sandbox_id) == SandboxState.PAUSED
        assert listed.pop(src.sandbox_id) == SandboxState.RUNNING
        assert set(listed.values()) <= {SandboxState.RUNNING}
        assert not any(n.startswith(f"fork-{src.sandbox_id}-") for n in _snapshot_dirs())
        assert Sandbox.connect(keep.sandbox_id).files.read("f.txt") == "kept"
        c = Sandbox.create(template=snap.snapshot_id, timeout=300)
        assert c.files.read("f.txt") == "kept"
        c.kill()
        # kill -9 while a snapshot is being written
        t = _in_background(lambda: keep.create_snapshot())
        time.sleep(0.05)
    finally:
        b.kill9()
    t.join(30)

    c2 = _start(tmp_path, "c", instance, monkeypatch)
    try:
        # no half-written snapshot is visible; a finished one is usable
        assert not any(n.startswith(".tmp-") for n in _snapshot_dirs())
        mine = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=keep.sandbox_id)
                .next_items()]  # fmt: skip
        assert snap.snapshot_id in mine
        snaps = mine
        for sid in mine:
            s = Sandbox.create(template=sid, timeout=300)
            assert s.files.read("f.txt") == "kept"
            s.kill()
    finally:
        _cleanup(c2, snaps)
