"""`aenv pull IMAGE`: an OCI image from a registry becomes a template on this host.

Like `aenv template build`, a node-local admin command (root, the node's data directory):
the image's layers go to the node's shared image cache, and the template appears in the
running node at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

import typer

from aenv.cli.errors import CliError
from aenv.cli.templates import CpuOpt, DiskOpt, MemoryOpt, run_local_build


def _default_name(image: str) -> str:
    """`docker.io/library/python:3.12-slim` -> `python-3.12-slim`."""
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", last.replace(":", "-")).strip(".-")
    return name or "image"


def pull(
    image: Annotated[str, typer.Argument(help="[REGISTRY/]REPOSITORY[:TAG|@DIGEST]")],
    name: Annotated[str | None, typer.Option("--name", "-n", help="Template name [default: "
                                             "from the image, e.g. python-3.12]",
                                             show_default=False)] = None,
    cpu: CpuOpt = None,
    memory: MemoryOpt = None,
    disk: DiskOpt = None,
    username: Annotated[str | None, typer.Option(help="Registry user name.",
                                                 show_default=False)] = None,
    password: Annotated[str | None, typer.Option(
        help="Registry password or token [env AENV_REGISTRY_PASSWORD].",
        envvar="AENV_REGISTRY_PASSWORD", show_default=False)] = None,
    start_cmd: Annotated[str | None, typer.Option(
        help="Command started in the template before it is snapshotted (not the image's "
        "Entrypoint/Cmd, which is never run by itself).", show_default=False)] = None,
    ready_cmd: Annotated[str | None, typer.Option(
        help="With --start-cmd: the snapshot is taken once this command exits 0 (polled each "
        "second, up to 5 minutes).", show_default=False)] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if up to date.")] = False,
) -> None:
    """Pull an OCI image and make it a template (root only; the node may be running)."""
    from aenv.images.registry import Credentials

    if (username is None) != (password is None):
        raise CliError("--username and --password go together")
    if ready_cmd is not None and not start_cmd:
        raise CliError("--ready-cmd needs --start-cmd")
    creds = Credentials(username, password) if username is not None and password else None
    template = name or _default_name(image)

    async def make(rt: Any, shape: Any, say: Callable[[str], None]) -> Any:
        from aenv.images.templates import template_from_image

        return await template_from_image(rt, image, template, shape, creds, start_cmd or None,
                                         say, force, ready_cmd)  # fmt: skip

    run_local_build("pull", template, cpu, memory, disk, make)
