"""Volumes mounted into real VMs with the unmodified SDK (`Volume`, `volume_mounts=`): shared
by two sandboxes at once, kept across a cold pause and resume and into forks, read back
through the content API; bad mounts refused and nothing left behind.

Every pause in the module's node is cold (AENV_HOT_PAUSE_S=0): the VMM ends, the slot's
NFS server with it, and the resumed guest's kernel reconnects to a new one in another slot
with the same file handles (volumes/server.py). A node killed with kill -9 leaves the
volume mounted in its adopted sandbox, and a restart keeps its data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import NotFoundException, Sandbox, SandboxException, Volume

from tests.support.guest import until

from .conftest import NodeProcess, free_port, running_node, start_node, stop_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with running_node(tmp_path_factory.mktemp("node"), AENV_HOT_PAUSE_S="0") as n:
        yield n  # E2B_VOLUME_API_URL points at it too: the content API, as users point it


def _run(sbx: Sandbox, cmd: str) -> str:
    return sbx.commands.run(cmd, timeout=120).stdout


def _read(vol: Volume, path: str) -> str | None:
    try:
        return vol.read_file(path)
    except NotFoundException:
        return None


def test_two_sandboxes_share_a_volume_through_pause_resume_and_fork(node: NodeProcess) -> None:
    vol = Volume.create("shared-data")
    vol.write_file("/seed.txt", "from the API\n")
    a = Sandbox.create(volume_mounts={"/mnt/data": vol})
    b = Sandbox.create(volume_mounts={"/home/user/data": "shared-data"})  # by name
    kids: list[Sandbox] = []
    snap = ""
    try:
        assert a.get_info().volume_mounts == [{"name": "shared-data", "path": "/mnt/data"}]
        assert _run(a, "cat /mnt/data/seed.txt") == "from the API\n"
        # The sandboxes' default user writes a fresh volume; the other sees it at once.
        _run(a, "echo written-by-a > /mnt/data/a.txt && whoami > /mnt/data/who")
        assert _run(b, "cat /home/user/data/a.txt") == "written-by-a\n"
        assert vol.read_file("/who").strip() == "user"
        _run(b, "echo written-by-b >> /home/user/data/a.txt")
        assert vol.read_file("/a.txt") == "written-by-a\nwritten-by-b\n"
        # A process holds a file open across the pause: it writes on after the resume.
        a.commands.run("exec 3>>/mnt/data/log; echo before >&3; "
                       "while [ ! -e /tmp/go ]; do sleep 0.2; done; echo after >&3",
                       background=True)  # fmt: skip
        until(lambda: _read(vol, "/log") == "before\n", 30)

        a.pause()
        vol.write_file("/while-paused.txt", "x")
        _run(b, "echo b-while-a-paused > /home/user/data/b.txt")
        a.connect()
        assert _run(a, "cat /mnt/data/while-paused.txt /mnt/data/b.txt") == "xb-while-a-paused\n"
        _run(a, "touch /tmp/go")
        until(lambda: _read(vol, "/log") == "before\nafter\n", 30)

        kids = a.fork(count=2)
        for i, k in enumerate(kids):
            _run(k, f"echo child-{i} > /mnt/data/child-{i}.txt")
        names = sorted(e.name for e in vol.list("/"))  # the children's writes too
        assert names == ["a.txt", "b.txt", "child-0.txt", "child-1.txt", "log", "seed.txt",
                         "while-paused.txt", "who"]  # fmt: skip
        assert vol.read_file("/child-1.txt") == "child-1\n"

        # A snapshot holds the mount, not the data: a create from it mounts the live volume.
        snap = a.create_snapshot().snapshot_id
        vol.write_file("/after-snapshot.txt", "live")
        kids.append(c := Sandbox.create(snap))
        assert c.get_info().volume_mounts == [{"name": "shared-data", "path": "/mnt/data"}]
        assert _run(c, "cat /mnt/data/after-snapshot.txt") == "live"
    finally:
        for s in (a, b, *kids):
            s.kill()
    # The data outlives every sandbox that mounted it; then the volume can go.
    assert vol.read_file("/a.txt") == "written-by-a\nwritten-by-b\n"
    assert Sandbox.delete_snapshot(snap) is True
    assert Volume.destroy(vol.volume_id) is True


def test_bad_mounts_are_refused_and_leave_nothing(node: NodeProcess) -> None:
    vol = Volume.create("checked")
    try:
        with pytest.raises(SandboxException, match="404: volume 'no-such-volume' not found"):
            Sandbox.create(volume_mounts={"/mnt/x": "no-such-volume"})
        for path in ("/etc", "/proc/x", "/", "relative", "/.aenv/bin"):
            with pytest.raises(SandboxException, match="path"):
                Sandbox.create(volume_mounts={path: vol})
        sbx = Sandbox.create(volume_mounts={"/mnt/v": vol})
        try:
            with node.api() as c:
                r = c.delete(f"/volumes/{vol.volume_id}")
            assert r.status_code == 409 and "mounted" in r.json()["message"]
        finally:
            sbx.kill()
    finally:
        assert Volume.destroy(vol.volume_id) is True
    with node.api() as c:
        assert c.get("/v2/sandboxes").json() == []


def test_a_volume_survives_kill_9_readoption_and_a_node_restart(
        tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """kill -9 of the node: the adopted sandbox's slot gets a new server and its guest goes
    on writing the same open file; after a clean restart the data is still there, for the
    content API and for a new sandbox."""
    port = free_port()
    monkeypatch.setenv("E2B_VOLUME_API_URL", f"http://127.0.0.1:{port}")
    a = start_node(tmp_path / "a.log", instance, monkeypatch, port)
    b = c = None
    try:
        vol = Volume.create("survivor")
        s = Sandbox.create(timeout=600, volume_mounts={"/mnt/v": vol})
        s.commands.run("exec 3>>/mnt/v/log; echo before >&3; "
                       "while [ ! -e /tmp/go ]; do sleep 0.2; done; echo after >&3",
                       background=True, timeout=0)  # fmt: skip
        until(lambda: _read(vol, "/log") == "before\n", 30)
        a.kill9()
        b = start_node(tmp_path / "b.log", instance, monkeypatch, port)
        _run(s, "touch /tmp/go")  # the same guest, adopted, through its slot's new server
        until(lambda: _read(vol, "/log") == "before\nafter\n", 30)
        s.kill()
        assert stop_node(b) == 0
        c = start_node(tmp_path / "c.log", instance, monkeypatch, port)
        assert Volume.connect(vol.volume_id).read_file("/log") == "before\nafter\n"
        t = Sandbox.create(volume_mounts={"/mnt/v": "survivor"})
        assert _run(t, "cat /mnt/v/log") == "before\nafter\n"
        t.kill()
        assert Volume.destroy(vol.volume_id) is True
    finally:
        for n in (c, b, a):
            if n is not None and n.proc is not None and n.proc.poll() is None:
                stop_node(n)
