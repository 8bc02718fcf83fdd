"""files.* through the unmodified SDK (AsyncSandbox): checklist items 6 to 12."""

from __future__ import annotations

import uuid

import pytest
from e2b import AsyncSandbox, FileNotFoundException, FileType


async def test_files_flow(asbx: AsyncSandbox) -> None:
    w = "at-" + uuid.uuid4().hex[:8]
    assert await asbx.files.make_dir(w) is True
    assert await asbx.files.make_dir(w) is False
    info = await asbx.files.write(f"{w}/a.txt", "hello")
    assert info.path == f"/home/user/{w}/a.txt"
    assert await asbx.files.read(f"{w}/a.txt") == "hello"
    await asbx.files.write_files(
        [{"path": f"{w}/c.txt", "data": "c"}, {"path": f"{w}/b.txt", "data": "b"}]
    )
    entries = await asbx.files.list(w)
    assert [e.name for e in entries] == ["a.txt", "b.txt", "c.txt"]
    assert all(e.type == FileType.FILE for e in entries)
    assert await asbx.files.exists(f"{w}/a.txt") is True
    assert await asbx.files.exists(f"{w}/zzz") is False
    moved = await asbx.files.rename(f"{w}/a.txt", f"{w}/n/a2.txt")
    assert moved.path == f"/home/user/{w}/n/a2.txt"
    with pytest.raises(FileNotFoundException):
        await asbx.files.read(f"{w}/a.txt")
    with pytest.raises(FileNotFoundException):
        await asbx.files.rename(f"{w}/a.txt", f"{w}/x")
    assert (await asbx.files.get_info(f"{w}/n/a2.txt")).size == 5
    await asbx.files.remove(w)
    assert await asbx.files.exists(w) is False
    await asbx.files.remove(w)


async def test_metadata_and_gzip(asbx: AsyncSandbox) -> None:
    w = "at-" + uuid.uuid4().hex[:8]
    info = await asbx.files.write(f"{w}/m", b"x" * 1000, metadata={"k": "v"}, gzip=True)
    assert info.metadata == {"k": "v"}
    assert bytes(await asbx.files.read(f"{w}/m", format="bytes", gzip=True)) == b"x" * 1000
