"""NeMo Gym's `e2b` sandbox provider, call for call (issue 31). nemo-gym 0.7.0 needs Python
>= 3.13.14, which no registry here has, so its calls are made here with the SDK, as its
`nemo_gym/sandbox/providers/e2b/{build.py,provider.py}` (0.7.0, read from the wheel) makes
them: the template pre-build (`exists(alias)` untagged, then `build(from_image, name=alias,
cpu_count, memory_mb)`), create (`secure=True`, `allow_internet_access=True`, envs,
metadata), `connect`, `is_running` as its status, exec as a background command waited on and
re-attached with `commands.connect(pid)`, `files.write` of str and bytes, `files.read(format=
"bytes")`, and `kill` as close (a second kill: NotFound is fine to it). 0.7.0 has no pause or
resume; the SDK's are exercised too, since a provider of the next version may call them.

Known upstream: 0.7.0 swaps in its own HTTP transport, whose signature e2b >= 2.53.1 no longer
calls (`TypeError: ... 'http_version'`); NeMo Gym works with e2b 2.36-2.52.1. Not aenv's.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest
from e2b import AsyncSandbox, AsyncTemplate, CommandExitException

from tests.support.registry import Seeded, have_tools

from .conftest import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")]


def _alias(image: str, cpu: int, mem: int) -> str:
    """build.py's template alias for an image and shape (lower-cased: aenv's names are)."""
    stem = image.rsplit("/", 1)[-1].replace(":", "-")
    digest = hashlib.sha256(f"{image}|cpu={cpu}|mem={mem}".encode()).hexdigest()[:12]
    return f"{stem[:48]}__{digest}{time.time_ns() % 10**6}".lower()


def test_the_nemo_gym_provider_calls(node: NodeProcess, seeded: Seeded) -> None:
    async def provider() -> None:
        alias = _alias(seeded.multi, 1, 512)
        # build.py: skip_existing, then build from the image
        assert not await AsyncTemplate.exists(alias)
        await asyncio.wait_for(AsyncTemplate.build(
            AsyncTemplate().from_image(seeded.multi), name=alias, cpu_count=1, memory_mb=512),
            600)  # fmt: skip
        assert await AsyncTemplate.exists(alias)
        # provider.py: create, not retried
        sbx = await AsyncSandbox.create(template=alias, timeout=3600, allow_internet_access=True,
                                        secure=True, envs={"GYM": "1"},
                                        metadata={"nemo_gym": "test"})  # fmt: skip
        try:
            same = await AsyncSandbox.connect(sbx.sandbox_id)
            assert await same.is_running()
            # exec: background, waited on, re-attached once as on a dropped stream
            h = await sbx.commands.run("sleep 1; echo $GYM; echo err >&2; exit 3",
                                       background=True, timeout=60.0)  # fmt: skip
            again = await sbx.commands.connect(h.pid, timeout=60)
            with pytest.raises(CommandExitException) as r:  # its result, as the provider reads
                await again.wait()
            assert r.value.exit_code == 3 and r.value.stdout == "1\n", r.value
            assert r.value.stderr == "err\n"
            # upload and download
            await sbx.files.write("/tmp/up.txt", "text\n")
            await sbx.files.write("/tmp/up.bin", bytes(range(256)))
            assert await sbx.files.read("/tmp/up.txt", format="bytes") == b"text\n"
            assert bytes(await sbx.files.read("/tmp/up.bin", format="bytes")) == bytes(range(256))
            # beyond 0.7.0: pause and resume through connect
            await sbx.pause()
            back = await AsyncSandbox.connect(sbx.sandbox_id)
            assert (await back.files.read("/tmp/up.txt")) == "text\n"
        finally:
            await sbx.kill()  # close
        assert not await sbx.is_running()  # status after close: stopped
        assert not await AsyncSandbox.kill(sbx.sandbox_id)  # a second close: NotFound

    asyncio.run(provider())
    with node.api() as c:
        for t in c.get("/templates").json():
            if "__" in t["templateID"] and t["templateID"].startswith("multi-1__"):
                assert c.delete(f"/templates/{t['templateID']}").status_code == 204
