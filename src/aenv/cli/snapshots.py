"""`aenv snapshot create|ls|rm`: named snapshots of sandboxes (E2B's snapshot API).

A snapshot id works wherever a template does: `aenv start SNAPSHOT_ID`.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

from aenv.cli import completion, output
from aenv.cli.client import ApiError, Node, resolve_prefix
from aenv.cli.errors import AenvTyper, CliError, each
from aenv.cli.sandboxes import JsonOpt, SandboxId

app = AenvTyper(help="Create, list and remove snapshots of sandboxes.", no_args_is_help=True)


def create(
    sandbox: SandboxId,
    name: Annotated[str | None, typer.Option("--name", "-n", help="A name for the snapshot.",
                                             show_default=False)] = None,
) -> None:
    """Snapshot a sandbox (it keeps running); prints the snapshot's id."""
    body: dict[str, Any] = {}
    if name:
        body["name"] = name
    with Node() as node:
        sid = node.resolve(sandbox)
        with output.status(f"Snapshotting {sid}..."):
            r = node.sandbox_call("POST", sid, "/snapshots", (200, 201), "snapshot", json=body)
    info = r.json()
    output.print_lines([str(info.get("snapshotID", ""))])


def ls(
    sandbox: Annotated[str | None, typer.Option(
        "--sandbox", help="Only snapshots of this sandbox (id or prefix).",
        autocompletion=completion.sandbox_ids, show_default=False)] = None,
    as_json: JsonOpt = None,
) -> None:
    """List snapshots."""
    with Node() as node:
        sid = node.resolve(sandbox) if sandbox else None
        items = node.snapshots(sid)
    if output.want_json(as_json):
        output.print_json(items)
        return
    # The node reports an id and names; show other fields only when it gives them.
    extra = [k for k in ("sandboxID", "createdAt") if any(s.get(k) for s in items)]
    rows = [
        [s.get("snapshotID", ""), ",".join(s.get("names") or []) or "-"]
        + [output.ago(s.get(k)) if k == "createdAt" else str(s.get(k) or "-") for k in extra]
        for s in items
    ]
    headers = ["SNAPSHOT", "NAMES"] + [{"sandboxID": "SANDBOX", "createdAt": "CREATED"}[k]
                                       for k in extra]  # fmt: skip
    output.print_table(headers, rows)


def _resolve(prefix: str, items: list[dict[str, Any]]) -> str:
    for s in items:
        if prefix in (s.get("names") or []):
            return str(s["snapshotID"])
    return resolve_prefix(prefix, [str(s.get("snapshotID", "")) for s in items], "snapshot")


def rm(
    snapshots: Annotated[list[str], typer.Argument(
        help="Snapshot ids (or unique prefixes, or names).", metavar="SNAPSHOT...",
        autocompletion=completion.snapshot_ids, show_default=False)],
) -> None:
    """Remove snapshots."""
    with Node() as node:
        items = node.snapshots()

        def one(prefix: str) -> None:
            snap = _resolve(prefix, items)
            try:
                node.call("DELETE", f"/templates/{quote(snap, safe='')}", (200, 204),
                          what="removing snapshots")  # fmt: skip
            except ApiError as e:
                if e.status == 404 and not e.unsupported:
                    raise CliError(f"no such snapshot: {snap}") from None
                raise
            output.print_lines([snap])

        each(snapshots, one)


app.command("create")(create)
app.command("ls")(ls)
app.command("rm")(rm)
