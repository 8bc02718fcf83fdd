"""`aenv logs ID`: a sandbox's log (what its node did to it), oldest first; docs/cli.md."""

from __future__ import annotations

from typing import Annotated

import typer

from aenv.cli import output
from aenv.cli.client import Node
from aenv.cli.sandboxes import JsonOpt, SandboxId


def logs(
    sandbox: SandboxId,
    level: Annotated[str, typer.Option(
        "--level", "-l", help="debug, info, warn or error: that level and above")] = "debug",
    search: Annotated[str | None, typer.Option(
        "--search", "-s", help="Only entries with this text (any case)", show_default=False,
    )] = None,
    last: Annotated[int, typer.Option(
        "--last", "-n", min=1, max=10_000, help="The newest N entries")] = 1000,
    as_json: JsonOpt = None,
) -> None:
    """Print a sandbox's log: what its node did to it (created, paused, resumed, forked,
    killed and why), also for a sandbox that ended in the last 24 hours (give its whole id)."""
    if level not in ("debug", "info", "warn", "error"):
        raise typer.BadParameter("must be debug, info, warn or error", param_hint="'--level'")
    params: dict[str, str | int] = {"direction": "backward", "limit": last, "level": level}
    if search:
        params["search"] = search
    with Node() as node:
        sid = node.resolve(sandbox)
        r = node.call("GET", f"/v2/sandboxes/{sid}/logs", (200,), what="logs", params=params)
    entries = list(reversed(r.json()["logs"]))  # asked newest first: the last N
    if output.want_json(as_json):
        output.print_json(entries)
        return
    output.print_lines([
        " ".join([e["timestamp"], e["level"].upper().ljust(5), e["message"],
                  *(f"{k}={v}" for k, v in e["fields"].items())])
        for e in entries])  # fmt: skip
