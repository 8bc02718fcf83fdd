"""Shell completion of sandbox ids, template names and snapshot ids, asked of the node.

typer calls these while the shell completes a word (`aenv completion SHELL --install` sets it
up for bash, zsh and fish). They must be quick and silent: a short timeout, and no answer at
all rather than an error when the node is down.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

COMPLETION_TIMEOUT_S = 3.0
COMPLETE_VAR = "_AENV_COMPLETE"


def _node() -> Any:
    from aenv.cli.client import Node

    return Node(timeout=COMPLETION_TIMEOUT_S)


def sandbox_ids(incomplete: str) -> list[tuple[str, str]]:
    try:
        with _node() as node:
            items = node.sandboxes()
    except Exception:
        return []
    return [
        (s["sandboxID"], f"{s.get('state', '')} {s.get('alias') or s.get('templateID', '')}")
        for s in items
        if s.get("sandboxID", "").startswith(incomplete)
    ]


def template_names(incomplete: str) -> list[tuple[str, str]]:
    try:
        with _node() as node:
            items = node.templates()
    except Exception:
        return []
    out: dict[str, str] = {}
    for t in items:
        shape = f"{t.get('cpuCount', '?')} vCPU, {t.get('memoryMB', '?')} MiB"
        for name in [*t.get("aliases", []), t.get("templateID", "")]:
            if name and name.startswith(incomplete):
                out.setdefault(name, shape)
    return sorted(out.items())


def snapshot_ids(incomplete: str) -> list[tuple[str, str]]:
    try:
        with _node() as node:
            items = node.snapshots()
    except Exception:
        return []
    return [
        (s["snapshotID"], ", ".join(s.get("names") or []))
        for s in items
        if s.get("snapshotID", "").startswith(incomplete)
    ]


# --- `aenv completion SHELL` ------------------------------------------------------------------

SHELLS = ("bash", "zsh", "fish")


def completion(
    shell: Annotated[str, typer.Argument(help="bash, zsh or fish.", metavar="SHELL",
                                         autocompletion=lambda: list(SHELLS))],
    install: Annotated[bool, typer.Option(
        "--install", help="Install it in the shell's start-up files instead of printing it.")
    ] = False,
) -> None:
    """Print (or install) the shell completion script; it completes commands, options,
    sandbox ids, template names and snapshot ids.

    bash: `source <(aenv completion bash)`, or `aenv completion bash --install` (writes
    ~/.bash_completions/aenv.sh and sources it from ~/.bashrc). zsh and fish likewise.
    """
    from typer._completion_shared import get_completion_script
    from typer._completion_shared import install as install_script

    if shell not in SHELLS:
        raise typer.BadParameter(f"{shell!r}: choose one of {', '.join(SHELLS)}",
                                 param_hint="SHELL")  # fmt: skip
    if install:
        _, path = install_script(shell=shell, prog_name="aenv", complete_var=COMPLETE_VAR)
        print(f"{shell} completion installed in {path}; it works in new shells")
        return
    print(get_completion_script(prog_name="aenv", complete_var=COMPLETE_VAR, shell=shell))
