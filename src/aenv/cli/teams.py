"""`aenv team create|ls|set|rm` and `aenv key create|ls|revoke`: the node's admin API
(docs/api.md, "Teams and keys"), with an admin key."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

from aenv.cli import output
from aenv.cli.client import Node
from aenv.cli.errors import AenvTyper, CliError
from aenv.cli.sandboxes import JsonOpt

team_app = AenvTyper(help="Teams: who owns sandboxes, templates, snapshots, volumes and "
                     "secrets, and their limits (admin key).", no_args_is_help=True)
key_app = AenvTyper(help="API keys: each belongs to a team (admin key).", no_args_is_help=True)

Limit = Annotated[int | None, typer.Option(min=0, show_default=False)]
Registries = Annotated[str | None, typer.Option(
    show_default=False, help="Registries its creates and builds may pull images from, "
    "comma-separated (host, host:port, host/path, *), in place of the node's; '' for none.")]


def _registries(text: str | None) -> list[str] | None:
    return None if text is None else [e.strip() for e in text.split(",") if e.strip()]


def _limit(n: int | None) -> str:
    return "-" if n is None else str(n)


def _show_teams(items: list[dict[str, Any]], as_json: bool | None) -> None:
    if output.want_json(as_json):
        output.print_json(items)
        return
    output.print_table(
        ["TEAM", "NAME", "SANDBOXES", "MAX", "MEMORY MIB", "MAX MIB", "REGISTRIES"],
        [[t["teamID"], t["name"], str(t["usage"]["sandboxes"]), _limit(t["maxSandboxes"]),
          str(t["usage"]["memoryMB"]), _limit(t["maxMemoryMB"]),
          "node's" if t.get("imageRegistries") is None else
          ",".join(t["imageRegistries"]) or "none"] for t in items])  # fmt: skip


@team_app.command("create")
def team_create(
    name: Annotated[str, typer.Argument(help="a-z, 0-9, '-' and '_'")],
    max_sandboxes: Limit = None, max_memory_mib: Limit = None,
    image_registries: Registries = None, as_json: JsonOpt = None,
) -> None:
    """Create a team (no limits but the node's unless given)."""
    body = {"name": name, "maxSandboxes": max_sandboxes, "maxMemoryMB": max_memory_mib,
            "imageRegistries": _registries(image_registries)}
    with Node() as node:
        _show_teams([node.json("POST", "/admin/teams", (201,), json=body)], as_json)


@team_app.command("ls")
def team_ls(as_json: JsonOpt = None) -> None:
    """List teams with what they run and their limits."""
    with Node() as node:
        _show_teams(node.json("GET", "/admin/teams"), as_json)


@team_app.command("set")
def team_set(
    team: Annotated[str, typer.Argument(help="The team's id or name.")],
    max_sandboxes: Limit = None, max_memory_mib: Limit = None,
    no_max_sandboxes: Annotated[bool, typer.Option(help="Remove the sandbox limit.")] = False,
    no_max_memory: Annotated[bool, typer.Option(help="Remove the memory limit.")] = False,
    image_registries: Registries = None,
    node_registries: Annotated[bool, typer.Option(
        help="The node's image_registries apply to it again.")] = False,
    as_json: JsonOpt = None,
) -> None:
    """Change a team's limits (those not named stay)."""
    body: dict[str, int | list[str] | None] = {}
    if image_registries is not None and node_registries:
        raise CliError("imageRegistries: give a list or --node-registries, not both")
    if image_registries is not None or node_registries:
        body["imageRegistries"] = _registries(image_registries)
    for field, value, clear in (("maxSandboxes", max_sandboxes, no_max_sandboxes),
                                ("maxMemoryMB", max_memory_mib, no_max_memory)):
        if value is not None and clear:
            raise CliError(f"{field}: give a limit or remove it, not both")
        if value is not None or clear:
            body[field] = value
    if not body:
        raise CliError("nothing to change: give --max-sandboxes, --max-memory-mib, "
                       "--image-registries or a --no-*")
    with Node() as node:
        _show_teams([node.json("PATCH", f"/admin/teams/{quote(team, safe='')}", json=body)],
                    as_json)  # fmt: skip


@team_app.command("rm")
def team_rm(team: Annotated[str, typer.Argument(help="The team's id or name.")]) -> None:
    """Remove a team that owns nothing any more, with its keys."""
    with Node() as node:
        node.call("DELETE", f"/admin/teams/{quote(team, safe='')}", (204,), what="team rm")


@key_app.command("create")
def key_create(
    team: Annotated[str, typer.Option("--team", "-t", help="The team's id or name.")],
    name: Annotated[str, typer.Option("--name", "-n", help="What the key is for.")] = "",
    admin: Annotated[bool, typer.Option(help="It may also manage teams and keys.")] = False,
    as_json: JsonOpt = None,
) -> None:
    """Create a key and print it: it is shown this once (only its hash is kept)."""
    body = {"team": team, "name": name, "admin": admin}
    with Node() as node:
        k = node.json("POST", "/admin/keys", (201,), json=body)
    if output.want_json(as_json):
        output.print_json(k)
        return
    output.print_lines([k["key"]])
    output.info(f"key {k['keyID']} of team {k['teamID']}: shown once, keep it now")


@key_app.command("ls")
def key_ls(
    team: Annotated[str | None, typer.Option("--team", "-t", help="Only this team's.",
                                             show_default=False)] = None,
    as_json: JsonOpt = None,
) -> None:
    """List keys (masked), revoked ones too."""
    with Node() as node:
        items = node.json("GET", "/admin/keys", params={"team": team} if team else None)
    if output.want_json(as_json):
        output.print_json(items)
        return
    output.print_table(
        ["KEY", "TEAM", "NAME", "MASK", "ADMIN", "CREATED", "REVOKED"],
        [[k["keyID"], k["teamID"], k["name"], k["mask"], "yes" if k["admin"] else "-",
          output.ago(k["createdAt"]), output.ago(k["revokedAt"]) if k["revokedAt"] else "-"]
         for k in items])  # fmt: skip


@key_app.command("revoke")
def key_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (aenv key ls).")]
               ) -> None:  # fmt: skip
    """Revoke a key: refused from the next request on."""
    with Node() as node:
        node.call("DELETE", f"/admin/keys/{quote(key_id, safe='')}", (204,), what="key revoke")
