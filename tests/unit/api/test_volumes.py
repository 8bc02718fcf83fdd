"""The volume API through the unmodified SDK (`e2b.AsyncVolume`) on a real HTTP server: the
control plane with the API key, the content API with the volume's token, and a volume's
content confined to its directory whatever the guests left in it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2b import AsyncVolume, NotFoundException, VolumeException
from e2b.exceptions import AuthenticationException

from aenv.api.app import Node

from .conftest import KEY, serve
from .test_control_plane import assert_error


@pytest.fixture
async def url(node: Node, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    async with serve(node) as port:
        base = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("E2B_VOLUME_API_URL", base)  # the content API, as users set it
        yield base


def _opts(url: str) -> dict[str, str]:
    return {"api_key": KEY, "api_url": url}


async def test_files_round_trip_through_the_sdk_and_persist_on_disk(node: Node, url: str) -> None:
    vol = await AsyncVolume.create("data-1", **_opts(url))
    assert vol.volume_id.startswith("vol_") and vol.token
    assert [v.name for v in await AsyncVolume.list(**_opts(url))] == ["data-1"]

    st = await vol.write_file("/a/b/hello.txt", "hello volume")
    assert (st.type, st.size, st.path, st.name) == ("file", 12, "/a/b/hello.txt", "hello.txt")
    assert await vol.read_file("/a/b/hello.txt") == "hello volume"
    await vol.write_file("/a/b/hello.txt", b"\x00" * 3_000_000)  # replaced, not appended
    assert await vol.read_file("/a/b/hello.txt", format="bytes") == b"\x00" * 3_000_000

    d = await vol.make_dir("/x/y/z", mode=0o750, force=True)
    assert d.type == "directory" and d.mode == 0o750
    assert (await vol.make_dir("/x/y/z", force=True)).path == "/x/y/z"  # mkdir -p
    with pytest.raises(VolumeException, match="409"):
        await vol.make_dir("/x/y/z")
    with pytest.raises(NotFoundException):
        await vol.make_dir("/nope/deeper")  # a missing parent without force

    names = [e.path for e in await vol.list("/", depth=3)]
    assert names == ["/a", "/a/b", "/a/b/hello.txt", "/x", "/x/y", "/x/y/z"]
    assert [e.path for e in await vol.list("/x")] == ["/x/y"]  # depth 1 by default
    assert [e.name for e in await vol.list("/a/b")] == ["hello.txt"]

    got = await vol.update_metadata("/a/b/hello.txt", uid=1234, gid=4321, mode=0o600)
    assert (got.uid, got.gid, got.mode) == (1234, 4321, 0o600)
    on_disk = node.orchestrator.config.volumes_dir / vol.volume_id / "a/b/hello.txt"
    assert (on_disk.stat().st_uid, on_disk.stat().st_mode & 0o7777) == (1234, 0o600)
    assert (await vol.write_file("/a/b/hello.txt", "v2")).uid == 1234  # an overwrite keeps it
    fresh = await vol.write_file("/new.txt", "n")
    assert (fresh.uid, fresh.gid, fresh.mode) == (1000, 1000, 0o644)  # as the volume's root

    assert await vol.exists("/a/b/hello.txt") and not await vol.exists("/a/missing")
    await vol.remove("/a")  # a whole tree
    assert not await vol.exists("/a/b/hello.txt")
    with pytest.raises(NotFoundException):
        await vol.get_info("/a")

    again = await AsyncVolume.connect(vol.volume_id, **_opts(url))  # by id: the same token
    assert again.token == vol.token and await again.read_file("/new.txt") == "n"
    assert await AsyncVolume.destroy(vol.volume_id, **_opts(url)) is True
    assert not (node.orchestrator.config.volumes_dir / vol.volume_id).exists()
    assert await AsyncVolume.destroy(vol.volume_id, **_opts(url)) is False


async def test_a_guests_symlinks_and_special_files_never_lead_the_host_out(
        node: Node, url: str, tmp_path: Path) -> None:  # fmt: skip
    vol = await AsyncVolume.create("guest-made", **_opts(url))
    root = node.orchestrator.config.volumes_dir / vol.volume_id
    secret = tmp_path / "host-secret"
    secret.write_text("host only")
    # What a guest (root on the mount) can leave in its volume.
    (root / "out").symlink_to(secret)
    (root / "outdir").symlink_to(tmp_path)
    (root / "abs").symlink_to("/etc")
    os.mkfifo(root / "fifo")
    (root / "in").symlink_to("real.txt")
    (root / "real.txt").write_text("inside")

    link = await vol.get_info("/out")
    assert link.type == "symlink" and link.target == str(secret)
    assert await vol.read_file("/in") == "inside"  # a symlink inside the volume is followed
    for call in (vol.read_file("/out"), vol.read_file("/outdir/host-secret"),
                 vol.read_file("/abs/passwd"), vol.list("/outdir"),
                 vol.write_file("/outdir/planted", "x"), vol.make_dir("/outdir/d"),
                 vol.read_file("/fifo"), vol.update_metadata("/out", mode=0o777),
                 vol.read_file("/../../etc/passwd")):  # fmt: skip
        with pytest.raises(VolumeException, match="400"):
            await call
    await vol.write_file("/out", "replaced")  # replaces the link, never writes through it
    assert secret.read_text() == "host only" and (root / "out").read_text() == "replaced"
    await vol.remove("/outdir")  # the link goes, not what it points to
    assert secret.exists() and not (tmp_path / "planted").exists()
    assert sorted(p.name for p in root.iterdir()) == ["abs", "fifo", "in", "out", "real.txt"]


async def test_tokens_names_and_bad_input(node: Node, url: str) -> None:
    a = await AsyncVolume.create("vol-a", **_opts(url))
    b = await AsyncVolume.create("vol-b", **_opts(url))
    await a.write_file("/f", "a's")
    with pytest.raises(AuthenticationException):  # b's token does not open a
        await a.read_file("/f", token=b.token)
    async with httpx.AsyncClient(base_url=url) as c:
        r = await c.get(f"/volumecontent/{a.volume_id}/path", params={"path": "/f"})
        assert_error(r, 401, "token")
        r = await c.get("/volumes", headers={"X-API-Key": "wrong"})
        assert_error(r, 401, "API key")
        h = {"X-API-Key": KEY}
        assert_error(await c.post("/volumes", json={"name": "vol-a"}, headers=h), 409, "exists")
        for name, text in [("", "letters"), ("a/b", "letters"), ("vol_x", "prefix"),
                           ("x" * 129, "128")]:  # fmt: skip
            assert_error(await c.post("/volumes", json={"name": name}, headers=h), 400, text)
        assert_error(await c.get("/volumes/vol_nope", headers=h), 404, "not found")
        bearer = {"Authorization": f"Bearer {a.token}"}
        r = await c.get(f"/volumecontent/{a.volume_id}/dir",
                        params={"path": "/", "depth": 99}, headers=bearer)  # fmt: skip
        assert_error(r, 400, "depth")
        r = await c.patch(f"/volumecontent/{a.volume_id}/path", params={"path": "/f"},
                          json={"mode": 0o17777}, headers=bearer)  # fmt: skip
        assert_error(r, 400, "mode")
        r = await c.put(f"/volumecontent/{a.volume_id}/file",
                        params={"path": "/f", "force": "false"}, content=b"x", headers=bearer)
        assert_error(r, 409, "exists")
    assert await a.read_file("/f") == "a's"
    with pytest.raises(NotFoundException):
        await AsyncVolume.get_info("vol_nope", **_opts(url))
    # A cut upload leaves neither a file nor its temporary beside it.
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"PUT /volumecontent/{a.volume_id}/file?path=%2Fcut HTTP/1.1\r\n"
                 f"Host: x\r\nAuthorization: Bearer {a.token}\r\n"
                 "Content-Length: 1000000\r\n\r\n".encode() + b"y" * 5000)
    await writer.drain()
    root = node.orchestrator.config.volumes_dir / a.volume_id
    await until(lambda: any(p.name.startswith(".cut") for p in root.iterdir()))
    writer.close()
    await until(lambda: sorted(p.name for p in root.iterdir()) == ["f"])


async def until(cond: Callable[[], bool], timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def test_mounts_at_create_are_checked_and_block_the_volume_s_delete(
        node: Node, client: httpx.AsyncClient) -> None:  # fmt: skip
    r = await client.post("/volumes", json={"name": "m"})
    vid = r.json()["volumeID"]

    def create(mounts: object) -> object:
        return client.post("/v2/sandboxes", json={"templateID": "base", "volumeMounts": mounts})

    assert_error(await create([{"name": "nope", "path": "/mnt/x"}]), 404, "volume 'nope'")
    for mounts, text in [
        ([{"name": "m", "path": "/etc"}], "system directory"),
        ([{"name": "m", "path": "/proc/x"}], "system directory"),
        ([{"name": "m", "path": "/.aenv"}], "system directory"),
        ([{"name": "m", "path": "mnt"}], "absolute"),
        ([{"name": "m", "path": "/a"}, {"name": "m", "path": "/a/"}], "two volumes"),
        ([{"name": "m", "path": f"/m{i}"} for i in range(9)], "at most 8"),
        (["m"], "{name, path}"),
    ]:  # fmt: skip
        assert_error(await create(mounts), 400, text)
    r = await create([{"name": "m", "path": "/home/user/m/"}])
    assert r.status_code == 201, r.text
    sid = r.json()["sandboxID"]
    got = (await client.get(f"/sandboxes/{sid}")).json()
    assert got["volumeMounts"] == [{"name": "m", "path": "/home/user/m"}]
    listed = (await client.get("/v2/sandboxes")).json()
    assert listed[0]["volumeMounts"] == got["volumeMounts"]
    assert_error(await client.delete(f"/volumes/{vid}"), 409, "mounted by 1 sandbox")
    assert (await client.delete(f"/sandboxes/{sid}")).status_code == 204
    assert (await client.delete(f"/volumes/{vid}")).status_code == 204
