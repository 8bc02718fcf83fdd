"""Guest symlinks never reach host files (issue 7): uploads and downloads are served by the
agent inside the VM, so every path (and every symlink in it) resolves in the guest's own
filesystem. A sentinel written on the host stays unreadable and unchanged through every
file path of the SDK and of the raw `/files` endpoint, whatever the guest links to."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import InvalidArgumentException, NotFoundException

from tests.support.host import DATA_DIR

from .conftest import API_KEY, NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_guest_symlinks_to_host_paths_resolve_in_the_guest(node: NodeProcess) -> None:
    secret = "host-sentinel-" + os.urandom(8).hex()
    # One sentinel where any host process could read it, one inside the node's data dir.
    sentinels = [Path(f"/tmp/aenv-sentinel-{os.urandom(4).hex()}"),
                 DATA_DIR / f"aenv-sentinel-{os.urandom(4).hex()}"]  # fmt: skip
    for p in sentinels:
        p.write_text(secret)
    sbx = Sandbox.create(timeout=120)
    try:
        links = {f"/home/user/l{i}": str(p) for i, p in enumerate(sentinels)}
        links |= {"/home/user/environ": "/proc/1/environ", "/home/user/data": str(DATA_DIR),
                  "/home/user/key": str(DATA_DIR / "api_key")}  # fmt: skip
        script = "; ".join(f"ln -s {t} {name}" for name, t in links.items())
        assert sbx.commands.run(script).exit_code == 0

        # Reads: through the links and by the host paths themselves: the guest has no such
        # files (its /proc/1 is its own init, whose environment is the guest's).
        for path in [*links, *map(str, sentinels), str(DATA_DIR / "api_key")]:
            try:
                data = sbx.files.read(path, format="bytes")
            except NotFoundException:
                continue
            assert secret.encode() not in data and API_KEY.encode() not in data, path
        try:
            names = [e.name for e in sbx.files.list("/home/user/data")]
        except (NotFoundException, InvalidArgumentException):
            names = []  # the guest has no such directory: the link dangles
        assert not {p.name for p in sentinels} & set(names), names

        # A write through a link lands in the guest's filesystem, not the host's.
        sbx.files.write("/home/user/l0", "guest-write")
        sbx.files.write(str(sentinels[1]), "guest-write")
        assert sbx.files.read("/home/user/l0") == "guest-write"

        # The raw endpoint with traversal tricks, through the node's proxy.
        with httpx.Client(base_url=node.origin, timeout=30) as c:
            for path in ("../../../../" + str(sentinels[1]), "/home/user/l1",
                         "/home/user/../../" + str(sentinels[0]).lstrip("/")):  # fmt: skip
                r = c.get("/files", params={"path": path, "username": "root"}, headers={
                    "E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
                    "X-Access-Token": sbx._envd_access_token or ""})  # fmt: skip
                assert secret not in r.text, (path, r.status_code)
        for p in sentinels:
            assert p.read_text() == secret  # untouched on the host
    finally:
        sbx.kill()
        for p in sentinels:
            p.unlink(missing_ok=True)
