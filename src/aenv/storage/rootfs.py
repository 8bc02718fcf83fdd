"""Root filesystem recipes for templates: Debian via debootstrap, and busybox-only.

A recipe fills a directory; `make_ext4` turns a directory into a raw ext4 disk image.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from aenv.storage import children, confined, packages

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_PACKAGES = (
    "bash", "coreutils", "python3", "python-is-python3", "sudo", "curl", "git",
    "ca-certificates", "procps", "iproute2",
)
USER_NAME, USER_UID = "user", 1000
BUSYBOX = Path("/bin/busybox")


class RootfsError(Exception):
    pass


def run(argv: list[str], log_file: Path | None = None) -> None:
    """Run a build step; its output goes to log_file, its tail into the error."""
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    try:
        rc = children.run(argv, out)
    finally:
        if log_file:
            out.close()  # type: ignore[union-attr]
    if rc != 0:
        tail = log_file.read_text(errors="replace")[-2000:] if log_file else ""
        raise RootfsError(f"{argv[0]} failed (exit {rc}): {tail.strip()[-600:]}")


def debian(root: Path, log_file: Path, log: Callable[[str], None],
           extra: tuple[str, ...] = ()) -> None:
    """Debian's minbase with DEBIAN_PACKAGES, then `extra` packages, all from Debian's signed
    archive, made on the host: downloading and unpacking run no package code; configuring
    does, and runs confined (`storage.confined`)."""
    log(f"debootstrap {DEBIAN_SUITE} (minbase) into {root}")
    # --foreign: download, check and unpack only; the second stage configures, confined.
    run(["debootstrap", "--foreign", "--variant=minbase",
         f"--include={','.join(DEBIAN_PACKAGES)}", DEBIAN_SUITE, str(root), DEBIAN_MIRROR],
        log_file)  # fmt: skip
    with confined.no_services(root):
        log("configuring the packages (confined: no network, no host processes)")
        _confined(root, ["/debootstrap/debootstrap", "--second-stage"], log_file)
        if extra:
            debs = packages.download(root, extra, log_file)
            log(f"installing {len(debs)} more packages ({', '.join(extra)})")
            _confined(root, ["apt-get", "install", "-y", "-q", "--no-install-recommends",
                             "-oDpkg::Options::=--force-unsafe-io",
                             *[f"/{d.relative_to(root)}" for d in debs]], log_file)  # fmt: skip
            shutil.rmtree(debs[0].parent)
    _add_user(root)
    # apt caches and lists are dead weight in every clone.
    for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (root / d).glob("*"):
            if p.is_file():
                p.unlink()


def familiar(root: Path, log_file: Path, log: Callable[[str], None]) -> None:
    """What E2B's base image gives: Python 3 with pip and venv, Node.js with npm, git, curl,
    a compiler toolchain (`packages.FAMILIAR`), on the minimal Debian."""
    debian(root, log_file, log, packages.FAMILIAR)


def _confined(root: Path, command: list[str], log_file: Path) -> None:
    try:
        confined.run(root, command, log_file)
    except confined.ConfinedError as e:
        raise RootfsError(str(e)) from None


def busybox(root: Path, log_file: Path, log: Callable[[str], None]) -> None:
    """A rootfs with nothing but a static busybox: proves the agent brings its own runtime."""
    log(f"busybox rootfs into {root}")
    if not BUSYBOX.exists():
        raise RootfsError("busybox-static is not installed (/bin/busybox missing)")
    for d in ("bin", "sbin", "etc", "tmp", "root", "home", "proc", "sys", "dev", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    names = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True).stdout
    for name in names.split():
        link = root / "bin" / name
        if not link.exists():
            link.symlink_to("busybox")
    # The E2B SDK runs every command as `/bin/bash -l -c CMD`; ash understands that, but
    # busybox has no `bash` applet name, so a one-line script hands over to sh.
    bash = root / "bin/bash"
    if bash.is_symlink() or not bash.exists():
        bash.unlink(missing_ok=True)
        bash.write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
        bash.chmod(0o755)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    _add_user(root)


def _add_user(root: Path) -> None:
    """User `user` (uid 1000, home /home/user, passwordless sudo), written directly so the
    recipe works in any rootfs without running its tools."""
    passwd, group = root / "etc/passwd", root / "etc/group"
    shell = "/bin/bash" if (root / "bin/bash").exists() else "/bin/sh"
    if f"\n{USER_NAME}:" not in "\n" + passwd.read_text():
        with passwd.open("a") as f:
            f.write(f"{USER_NAME}:x:{USER_UID}:{USER_UID}::/home/{USER_NAME}:{shell}\n")
        with group.open("a") as f:
            f.write(f"{USER_NAME}:x:{USER_UID}:\n")
        shadow = root / "etc/shadow"
        if shadow.exists():
            with shadow.open("a") as f:
                f.write(f"{USER_NAME}:*:19000:0:99999:7:::\n")
    home = root / "home" / USER_NAME
    home.mkdir(parents=True, exist_ok=True)
    shutil.chown(home, USER_UID, USER_UID)
    home.chmod(0o755)
    if (root / "etc/sudoers.d").is_dir():
        f = root / "etc/sudoers.d/aenv-user"
        f.write_text(f"{USER_NAME} ALL=(ALL:ALL) NOPASSWD: ALL\n")
        f.chmod(0o440)


def make_ext4(root: Path, image: Path, size_mib: int, log_file: Path) -> None:
    """A sparse raw ext4 image of size_mib holding root's tree (mkfs.ext4 -d, no mount)."""
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    # lazy_journal_init: the journal stays holes (a fresh sparse file reads as zeros, so
    # there is no stale journal to replay) instead of 64 MiB of written zeros per template.
    run(
        ["mkfs.ext4", "-q", "-F", "-L", "rootfs", "-E", "root_owner=0:0,lazy_journal_init=1",
         "-O", "^has_journal" if size_mib < 64 else "has_journal", "-d", str(root), str(image)],
        log_file,
    )
