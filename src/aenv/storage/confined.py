"""Package code run on the host while aenv's own templates are made: confined.

aenv's own templates (`storage.rootfs` recipes) are built from Debian's signed packages on the
host, because a package manager under TCG is many times slower. Unpacking a package runs none
of its code; configuring it runs its maintainer scripts as root. Those run here only: chrooted
into the tree being built, in new mount, pid and network namespaces (so no network, no host
process to see or signal, and nothing left running: the namespace's processes end with its
first one), with a `policy-rc.d` that lets no package start a service. User Dockerfiles never
come here: they run in jailed build VMs (`images.builds`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from aenv.storage import children

POLICY_RC_D = "usr/sbin/policy-rc.d"
# What maintainer scripts see: no terminal, no locale, no questions.
ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "DEBIAN_FRONTEND": "noninteractive",
    "DEBCONF_NONINTERACTIVE_SEEN": "true",
    "LC_ALL": "C",
    "HOME": "/root",
}


class ConfinedError(Exception):
    pass


def argv(root: Path, command: list[str]) -> list[str]:
    """`command` inside `root`, in its own mount, pid and network namespaces, with a /proc
    of that pid namespace mounted in the tree (gone with the namespace)."""
    return ["unshare", "--mount", "--pid", "--net", "--fork", "--kill-child",
            f"--mount-proc={root / 'proc'}", "--", "chroot", str(root), *command]  # fmt: skip


def run(root: Path, command: list[str], log_file: Path) -> None:
    """`command` confined to `root` (see the module); its output to `log_file`, its tail into
    the error if it fails."""
    (root / "proc").mkdir(exist_ok=True)
    with log_file.open("ab") as out:
        out.write(f"\n### confined: {' '.join(command)}\n".encode())
        out.flush()
        rc = children.run(argv(root, command), out, env=ENV)
    if rc != 0:
        tail = log_file.read_text(errors="replace").strip()[-600:]
        raise ConfinedError(f"{command[0]} in {root} failed (exit {rc}): {tail}")


@contextlib.contextmanager
def no_services(root: Path) -> Iterator[None]:
    """A `policy-rc.d` that refuses every service start (invoke-rc.d's rule, exit 101) while
    packages are configured; removed after, so the template's own init is unaffected."""
    policy = root / POLICY_RC_D
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text("#!/bin/sh\n# aenv: no service starts while a template is built\nexit 101\n")
    policy.chmod(0o755)
    try:
        yield
    finally:
        policy.unlink(missing_ok=True)
