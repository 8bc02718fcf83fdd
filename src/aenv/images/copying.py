"""A COPY step inside the build VM, with E2B's semantics: the SDK's archive holds the matched
files under their context paths; the source's directory part (its glob stripped) is what is
copied: a directory's contents go into `dest`, a file or symlink becomes `dest` (or goes into
it, for a `dest` ending in `/`). Owner is the step's, else the current user's; a mode applies
to every copied file and directory, never through a symlink.

The archive was checked on the host (`context.check_archive`): nothing in it leaves its
directory. It is unpacked in the guest with the tools drive's busybox, so images without
tar or cp work too.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

from aenv.images.agent import AgentError, BuildAgent
from aenv.images.context import is_gzip
from aenv.images.stepcache import StepState
from aenv.images.steps import Step, resolve

BB = "/.aenv/bin/busybox"
_GLOB = re.compile(r"[*?\[{]")


class CopyFailed(Exception):
    pass


def source_base(src: str) -> str:
    """`folder/*` -> `folder`, `a/**/b.txt` -> `a`, `a.txt` -> `a.txt`, `*` -> `.`."""
    parts = []
    for part in src.strip("/").split("/"):
        if _GLOB.search(part):
            break
        parts.append(part)
    return "/".join(p for p in parts if p not in ("", ".")) or "."


def copy_script(archive: str, gz: bool, base: str, dest: str, owner: str, mode: str,
                busybox: str = BB) -> str:
    q = shlex.quote
    lines = [
        "set -e",
        f"bb={q(busybox)}",
        'd=$($bb mktemp -d /tmp/.aenv-copy.XXXXXX)',
        f"$bb tar -x{'z' if gz else ''}f {q(archive)} -C \"$d\"",
        f"$bb rm -f {q(archive)}",
        f"s=\"$d\"/{q(base)}",
        f"dest={q(dest)}",
        f'[ -e "$s" ] || [ -L "$s" ] || {{ echo "COPY: no such source: {base}" >&2; exit 2; }}',
        'if [ -d "$s" ] && [ ! -L "$s" ]; then',
        '  $bb mkdir -p "$dest"; $bb cp -a "$s"/. "$dest"/; set -- "$dest"',
        "else",
        '  case "$dest" in */) $bb mkdir -p "$dest"; dest="$dest$($bb basename "$s")";;'
        ' *) $bb mkdir -p "$($bb dirname "$dest")";; esac',
        '  $bb rm -rf "$dest"; $bb cp -a "$s" "$dest"; set -- "$dest"',
        "fi",
        f"$bb chown -Rh {q(owner)} \"$1\"",
    ]
    if mode:
        lines.append(f"$bb find \"$1\" ! -type l -exec $bb chmod {q(mode)} {{}} +")
    lines.append('$bb rm -rf "$d"')
    return "\n".join(lines)


async def copy_into(agent: BuildAgent, archive: Path, step: Step, state: StepState,
                    say: Callable[[str], None]) -> None:
    """CopyFailed says why, naming the source."""
    src, dest = step.args[0], step.args[1]
    owner = step.args[2] if len(step.args) > 2 and step.args[2] else state.user
    if ":" not in owner:
        owner = f"{owner}:{owner}"
    mode = step.args[3] if len(step.args) > 3 else ""
    target = resolve(dest, state.workdir)
    staged = f"/tmp/.aenv-copy-{step.filesHash}.tar"
    try:
        await agent.write(staged, archive.read_bytes())
    except AgentError as e:
        raise CopyFailed(f"COPY {src}: writing its files into the build VM failed: {e}") from None
    script = copy_script(staged, is_gzip(archive), source_base(src), target, owner, mode)
    out: list[str] = []
    code = await agent.run(script, user="root", on_line=out.append)
    for ln in out:
        say(ln)
    if code != 0:
        raise CopyFailed(f"COPY {src} {dest} failed (exit {code}): {'; '.join(out[-3:])}")
