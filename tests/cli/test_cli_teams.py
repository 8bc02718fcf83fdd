"""`aenv team` and `aenv key` against a node with the fake runtime: a team and its key are
made, the key works at once and only for its team, revoking it stops it at once, and bad
input is one line on stderr with a non-zero exit."""

from __future__ import annotations

import json

import pytest

from .conftest import Node, assert_one_line_error

pytestmark = pytest.mark.timeout(120)


def test_team_and_key_lifecycle(fake_node: Node) -> None:
    p = fake_node.cli("team", "create", "cli-blue", "--max-sandboxes", "1", "--json")
    assert p.returncode == 0, p.stderr
    team = json.loads(p.stdout)[0]
    assert team["name"] == "cli-blue" and team["maxSandboxes"] == 1
    p = fake_node.cli("key", "create", "--team", "cli-blue", "--name", "trainer")
    assert p.returncode == 0, p.stderr
    key = json.loads(p.stdout)["key"]  # piped: JSON
    assert key.startswith("aenv_")
    blue = {"AENV_API_KEY": key}
    p = fake_node.cli("start", "-d", "base", "--timeout", "120", env=blue)
    assert p.returncode == 0, p.stderr
    sid = p.stdout.strip()
    assert sid not in fake_node.sandbox_ids()  # the node key's team does not see it
    assert [s["sandboxID"] for s in json.loads(fake_node.cli("ls", env=blue).stdout)] == [sid]
    assert_one_line_error(fake_node.cli("start", "-d", "base", env=blue),
                          "may run 1 sandboxes")  # its limit: 429, no retry
    assert_one_line_error(fake_node.cli("team", "ls", env=blue), "not an admin key")

    p = fake_node.cli("team", "ls", "--json")
    row = next(t for t in json.loads(p.stdout) if t["name"] == "cli-blue")
    assert row["usage"]["sandboxes"] == 1
    assert_one_line_error(fake_node.cli("team", "rm", "cli-blue"), "still owns 1 sandbox")
    p = fake_node.cli("rm", sid, env=blue)
    assert p.returncode == 0, p.stderr
    keys = json.loads(fake_node.cli("key", "ls", "--team", "cli-blue", "--json").stdout)
    assert [k["name"] for k in keys] == ["trainer"] and key not in json.dumps(keys)
    p = fake_node.cli("key", "revoke", keys[0]["keyID"])
    assert p.returncode == 0, p.stderr
    assert_one_line_error(fake_node.cli("ls", env=blue), "rejected the API key")
    p = fake_node.cli("team", "rm", "cli-blue")
    assert p.returncode == 0, p.stderr
    assert "cli-blue" not in fake_node.cli("team", "ls").stdout


def test_a_teams_image_registries(fake_node: Node) -> None:
    p = fake_node.cli("team", "create", "cli-pull", "--image-registries", "ghcr.io/org, 127.0.0.1",
                      "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)[0]["imageRegistries"] == ["ghcr.io/org", "127.0.0.1"]
    p = fake_node.cli("team", "set", "cli-pull", "--image-registries", "", "--json")
    assert json.loads(p.stdout)[0]["imageRegistries"] == []  # it may pull nothing
    p = fake_node.cli("team", "set", "cli-pull", "--node-registries", "--json")
    assert json.loads(p.stdout)[0]["imageRegistries"] is None
    table = fake_node.cli("team", "ls", "--table").stdout
    assert "REGISTRIES" in table and "node's" in table
    assert fake_node.cli("team", "rm", "cli-pull").returncode == 0


@pytest.mark.parametrize(("args", "needle"), [
    (("team", "create", "Bad Name"), "team name"),
    (("team", "set", "nobody", "--max-sandboxes", "2"), "not found"),
    (("team", "set", "default"), "nothing to change"),
    (("team", "set", "default", "--max-sandboxes", "1", "--no-max-sandboxes"), "not both"),
    (("team", "set", "default", "--image-registries", "x.io", "--node-registries"), "not both"),
    (("team", "create", "regs", "--image-registries", "https://x.io"), "imageRegistries"),
    (("key", "create", "--team", "nobody"), "not found"),
    (("key", "revoke", "node"), "AENV_API_KEY"),
    (("key", "revoke", "key_missing"), "not found"),
])  # fmt: skip
def test_bad_input_is_one_line(fake_node: Node, args: tuple[str, ...], needle: str) -> None:
    assert_one_line_error(fake_node.cli(*args), needle)
