"""Teams with real VMs and the unmodified SDK: a team's key sees its own sandboxes,
templates, snapshots and volumes and nothing of another team's (404s), a team at its limit
gets a 429 the SDK does not retry, and a revoked key is refused from the next call on."""

from __future__ import annotations

import os
import time

import pytest
from e2b import (
    AuthenticationException,
    NotFoundException,
    RateLimitException,
    Sandbox,
    SandboxException,
    Template,
    Volume,
)

from tests.support.image_state import removed_after

from .conftest import NodeProcess


def test_a_teams_key_reaches_only_its_team_and_stops_at_its_limit_and_revocation(
        node: NodeProcess) -> None:  # fmt: skip
    tag = os.urandom(3).hex()
    with node.api() as admin:
        r = admin.post("/admin/teams", json={"name": f"e2e-{tag}", "maxSandboxes": 2})
        assert r.status_code == 201, r.text
        team = r.json()["teamID"]
        r = admin.post("/admin/keys", json={"team": team, "name": "e2e"})
        assert r.status_code == 201, r.text
        key, key_id = r.json()["key"], r.json()["keyID"]
    blue = {"api_key": key}
    name = f"team-tpl-{tag}"
    boxes: list[Sandbox] = []
    vol = None
    with removed_after():
        try:
            Template.build(Template().from_template("base").run_cmd(
                "echo blue > /tmp/team.txt", user="root"), name, **blue)  # fmt: skip
            assert Template.exists(name, **blue) and not Template.exists(name)
            boxes.append(Sandbox.create(name, timeout=300, **blue))
            sbx = boxes[0]
            assert sbx.commands.run("cat /tmp/team.txt").stdout == "blue\n"
            assert sbx.get_info().template_id == name  # its own name, as the team gave it
            with pytest.raises(SandboxException, match="404: template .* not found"):
                Sandbox.create(name, timeout=60)  # the default team has no such template
            with pytest.raises(SandboxException):
                Sandbox.connect(sbx.sandbox_id)  # nor that sandbox
            assert Sandbox.kill(sbx.sandbox_id) is False
            assert sbx.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}
            assert [s.sandbox_id for s in Sandbox.list(**blue).next_items()] == [sbx.sandbox_id]

            snap = sbx.create_snapshot()
            with pytest.raises(SandboxException):
                Sandbox.create(snap.snapshot_id, timeout=60)
            assert Sandbox.delete_snapshot(snap.snapshot_id) is False

            vol = Volume.create(f"vol-{tag}", **blue)
            with pytest.raises(NotFoundException):
                Volume.get_info(vol.volume_id)
            # The team's second sandbox, from its snapshot and with its volume; the third
            # is over its limit: a 429 the SDK raises at once.
            boxes.append(Sandbox.create(snap.snapshot_id, timeout=300,
                                        volume_mounts={"/mnt/v": vol}, **blue))  # fmt: skip
            boxes[1].files.write("/mnt/v/f.txt", "team data")
            assert boxes[1].commands.run("cat /tmp/team.txt").stdout == "blue\n"
            t0 = time.monotonic()
            with pytest.raises(RateLimitException, match="may run 2 sandboxes"):
                Sandbox.create("base", timeout=60, **blue)
            assert time.monotonic() - t0 < 10  # not retried
            other = Sandbox.create("base", timeout=60)  # the default team is not held back
            other.kill()
            assert vol.read_file("f.txt") == "team data"
            assert Sandbox.delete_snapshot(snap.snapshot_id, **blue) is True
        finally:
            for b in boxes:
                Sandbox.kill(b.sandbox_id, **blue)
            if vol is not None:
                Volume.destroy(vol.volume_id, **blue)
            with node.api() as admin:
                admin.delete(f"/templates/{name}", headers={"X-API-Key": key})
    with node.api() as admin:
        assert admin.delete(f"/admin/keys/{key_id}").status_code == 204
    with pytest.raises(AuthenticationException):
        Sandbox.list(**blue).next_items()  # refused from the next call on
    with node.api() as admin:
        r = admin.delete(f"/admin/teams/{team}")
        assert r.status_code == 204, r.text  # it owns nothing any more
