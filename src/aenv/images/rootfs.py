"""An unpacked image made fit for a sandbox: the `user` account E2B clients expect, and a
shell at `/bin/bash` (the SDK runs every command as `/bin/bash -l -c ...`) even in images
without bash (busybox, Alpine) or without any shell (distroless: the tools drive's busybox).

The tree is untrusted: its symlinks may point anywhere, absolute ones at the host's own
files. Every path written here is resolved the way the guest will see it, inside the tree,
as a chroot would (`resolve_in_root`), so nothing outside it is ever touched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

USER_NAME = "user"
PREFERRED_UID = 1000
MAX_SYMLINKS = 40
TOOLS_BUSYBOX = "/.aenv/bin/busybox"  # where the guest init mounts the tools drive's busybox


class UnsafePath(Exception):
    pass


def resolve_in_root(root: Path, path: str) -> Path:
    """`path` (absolute, as the guest sees it) on the host, with every symlink on the way
    followed inside `root`: an absolute target is taken from `root`, `..` stops at it."""
    parts = [p for p in path.split("/") if p and p != "."]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, part)
        if here.is_symlink():
            hops += 1
            if hops > MAX_SYMLINKS:
                raise UnsafePath(f"too many symlinks resolving {path}")
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p and p != "."] + parts
            continue
        done.append(part)
    return root.joinpath(*done)


def _read(root: Path, path: str) -> str:
    p = resolve_in_root(root, path)
    return p.read_text(errors="replace") if p.is_file() else ""


def _append(root: Path, path: str, line: str) -> None:
    p = resolve_in_root(root, path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = p.read_text(errors="replace") if p.is_file() else ""
    if text and not text.endswith("\n"):
        line = "\n" + line
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "a") as f:
        f.write(line + "\n")


def _ids(table: str) -> dict[str, int]:
    out = {}
    for ln in table.splitlines():
        f = ln.split(":")
        if len(f) >= 3 and f[2].isdigit():
            out[f[0]] = int(f[2])
    return out


@dataclass(frozen=True)
class UserAccount:
    name: str
    uid: int
    added: bool


def ensure_user(root: Path) -> UserAccount:
    """`user` with home /home/user: uid 1000 unless another account holds it (e.g. `node` in
    Node images), then the next free uid from 1000 up."""
    passwd = _read(root, "/etc/passwd")
    users = _ids(passwd)
    if USER_NAME in users:
        return UserAccount(USER_NAME, users[USER_NAME], False)
    groups = _ids(_read(root, "/etc/group"))
    if not passwd:
        _append(root, "/etc/passwd", "root:x:0:0:root:/root:/bin/sh")
    taken = set(users.values()) | set(groups.values())
    uid = PREFERRED_UID
    while uid in taken:
        uid += 1
    shell = "/bin/bash"
    _append(root, "/etc/passwd", f"{USER_NAME}:x:{uid}:{uid}::/home/{USER_NAME}:{shell}")
    if USER_NAME not in groups:
        _append(root, "/etc/group", f"{USER_NAME}:x:{uid}:")
    if resolve_in_root(root, "/etc/shadow").is_file():
        _append(root, "/etc/shadow", f"{USER_NAME}:*:19000:0:99999:7:::")
    home = resolve_in_root(root, f"/home/{USER_NAME}")
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, uid, uid, follow_symlinks=False)
    home.chmod(0o755)
    sudoers = resolve_in_root(root, "/etc/sudoers.d")
    if sudoers.is_dir():
        f = sudoers / "aenv-user"
        f.write_text(f"{USER_NAME} ALL=(ALL:ALL) NOPASSWD: ALL\n")
        f.chmod(0o440)
    return UserAccount(USER_NAME, uid, True)


def _exists(root: Path, path: str) -> bool:
    p = resolve_in_root(root, path)
    return p.exists() or p.is_symlink()


def ensure_shell(root: Path) -> None:
    """/bin/sh and /bin/bash exist in the guest: an image's own first, else busybox's."""
    for d in ("/bin", "/tmp"):
        resolve_in_root(root, d).mkdir(parents=True, exist_ok=True)
    tmp = resolve_in_root(root, "/tmp")
    tmp.chmod(0o1777)
    if not _exists(root, "/bin/sh"):
        os.symlink(TOOLS_BUSYBOX, resolve_in_root(root, "/bin/sh"))
    if not _exists(root, "/bin/bash"):
        bash = resolve_in_root(root, "/bin/bash")
        fd = os.open(bash, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
        with os.fdopen(fd, "w") as f:
            f.write('#!/bin/sh\nexec /bin/sh "$@"\n')
    for d in ("/proc", "/sys", "/dev", "/run", "/root", "/home"):
        resolve_in_root(root, d).mkdir(parents=True, exist_ok=True)


def prepare(root: Path, workdir: str | None = None) -> UserAccount:
    """Shell, `user`, and the image's WorkingDir (made if missing, as Docker does)."""
    ensure_shell(root)
    account = ensure_user(root)
    if workdir:
        resolve_in_root(root, workdir).mkdir(parents=True, exist_ok=True)
    return account


def user_name(root: Path, user: str | None) -> str | None:
    """An image's `User` (name, uid, name:group, uid:gid) as the account name the agent runs
    commands as; None when the image names none."""
    if not user:
        return None
    name = user.split(":", 1)[0]
    if name.isdigit():
        by_uid = {uid: n for n, uid in _ids(_read(root, "/etc/passwd")).items()}
        return by_uid.get(int(name), name)
    return name
