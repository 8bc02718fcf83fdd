"""Build and cache the guest kernel.

One minimal kernel serves every sandbox: `bzImage` for QEMU, `vmlinux` for Firecracker. It is
built from Debian's `linux-source-6.12` package (never a kernel package installed on the host)
as tinyconfig + kvm_guest.config + `kernel.fragment`, and cached under
`<artifacts>/kernel/<source version>-<fragment hash>/`, so a new source package or a changed
fragment gives a new kernel and an unchanged one is never rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

SOURCE_PACKAGE = "linux-source-6.12"
SOURCE_TARBALL = Path("/usr/src/linux-source-6.12.tar.xz")
FRAGMENT_PATH = Path(__file__).with_name("kernel.fragment")
# Plain `tinyconfig` on x86 is 32-bit: ARCH must be given to every make call.
ARCH = "x86_64"
TOOLS = ("make", "gcc", "flex", "bison", "bc", "tar", "xz")
LOG_TAIL_LINES = 40

_SET = re.compile(r"^(CONFIG_[A-Za-z0-9_]+)=(.*)$")
_UNSET = re.compile(r"^# (CONFIG_[A-Za-z0-9_]+) is not set$")


class KernelBuildError(Exception):
    """The guest kernel could not be built (message says why, first line alone suffices)."""


def parse_config(text: str, *, strict: bool = False) -> dict[str, str | None]:
    """Options of a Kconfig file or fragment: value, or None for "must be / is unset".

    `strict` (for our fragment) rejects lines that are neither an option, a comment nor
    blank, so a typo cannot silently drop an option from the check.
    """
    options: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if m := _SET.match(line):
            # Kconfig writes "=n" as "is not set"; treat both the same.
            options[m[1]] = None if m[2] == "n" else m[2]
        elif m := _UNSET.match(line):
            options[m[1]] = None
        elif strict and line and not line.startswith("#"):
            raise KernelBuildError(f"kernel fragment line {number} is not an option: {raw!r}")
    return options


def verify_config(fragment_text: str, config_text: str) -> list[str]:
    """Fragment options the final .config does not have with the same value.

    `make olddefconfig` silently drops options whose dependencies are off, so this is the
    only way to know the kernel really has what the fragment asks for.
    """
    have = parse_config(config_text)
    problems = []
    for name, want in parse_config(fragment_text, strict=True).items():
        got = have.get(name)
        if got != want:
            wanted = f"{name}={want}" if want is not None else f"{name} unset"
            problems.append(f"{wanted} (final .config: {got if got is not None else 'unset'})")
    return problems


def fragment_hash(fragment_text: str) -> str:
    return hashlib.sha256(fragment_text.encode()).hexdigest()[:16]


def source_version() -> str:
    """Installed version of the linux-source package (part of the cache key)."""
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${db:Status-Status} ${Version}", SOURCE_PACKAGE],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError as e:
        raise KernelBuildError("dpkg-query not found: a Debian-based host is required") from e
    status, _, version = out.stdout.strip().partition(" ")
    if out.returncode != 0 or status != "installed" or not version:
        raise KernelBuildError(
            f"{SOURCE_PACKAGE} is not installed (apt-get install {SOURCE_PACKAGE})"
        )
    return version


def kernel_cache_key(fragment_text: str | None = None, version: str | None = None) -> str:
    """`<linux-source version>-<fragment sha256[:16]>`, safe as a directory name."""
    if fragment_text is None:
        fragment_text = FRAGMENT_PATH.read_text()
    if version is None:
        version = source_version()
    # Debian versions may carry an epoch ("1:…"); keep the name to a portable alphabet.
    safe = re.sub(r"[^A-Za-z0-9.+~_-]", "_", version)
    return f"{safe}-{fragment_hash(fragment_text)}"


def is_built(artifacts_dir: Path) -> bool:
    """Whether `ensure_kernel` would find its kernel in the cache (no build)."""
    try:
        key = kernel_cache_key()
    except KernelBuildError:
        return False
    return (Path(artifacts_dir) / "kernel" / key / "bzImage").is_file()


def ensure_kernel(
    artifacts_dir: Path,
    *,
    log: Callable[[str], None] = print,
    jobs: int | None = None,
) -> Path:
    """Path of the cached `bzImage`, building it first (~7 min on 2 cores) if needed.

    `vmlinux` (ELF with a PVH entry point) and the final `.config` sit next to it.
    """
    fragment = FRAGMENT_PATH.read_text()
    parse_config(fragment, strict=True)  # fail on a broken fragment before any work
    kernel_dir = Path(artifacts_dir) / "kernel"
    final = kernel_dir / kernel_cache_key(fragment)
    if (final / "bzImage").is_file():
        return final / "bzImage"
    if not SOURCE_TARBALL.is_file():
        raise KernelBuildError(f"{SOURCE_TARBALL} missing (reinstall {SOURCE_PACKAGE})")
    if missing := [t for t in TOOLS if shutil.which(t) is None]:
        raise KernelBuildError(f"kernel build tools missing: {', '.join(missing)}")
    kernel_dir.mkdir(parents=True, exist_ok=True)
    with _locked(kernel_dir / ".lock"):
        # Another process may have built it while we waited for the lock.
        if (final / "bzImage").is_file():
            return final / "bzImage"
        # Holding the lock, any tmp-* is a leftover of a killed build: nothing half-made stays.
        for stale in kernel_dir.glob("tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        # A final dir without bzImage was damaged by hand: replace it.
        shutil.rmtree(final, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=kernel_dir))
        try:
            _build(tmp, fragment, final.name, jobs or len(os.sched_getaffinity(0)), log)
            os.rename(tmp / "out", final)  # atomic: the cache dir is complete or absent
        except OSError as e:  # disk full, permissions: still one clear error type
            raise KernelBuildError(f"kernel build failed: {e}") from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"kernel: ready at {final / 'bzImage'}")
    return final / "bzImage"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(tmp: Path, fragment: str, key: str, jobs: int, log: Callable[[str], None]) -> None:
    src, out, build_log = tmp / "src", tmp / "out", tmp / "build.log"
    src.mkdir()
    out.mkdir()
    started = time.monotonic()

    # The build host's user and name would otherwise show in every guest's `uname -v`.
    env = {**os.environ, "KBUILD_BUILD_USER": "aenv", "KBUILD_BUILD_HOST": "aenv"}

    def run(phase: str, *cmd: str) -> None:
        t0 = time.monotonic()
        with build_log.open("a") as f:
            f.write(f"\n### {phase}: {' '.join(cmd)}\n")
            f.flush()
            rc = subprocess.run(
                cmd, cwd=src, stdout=f, stderr=subprocess.STDOUT, env=env
            ).returncode
            f.write(f"### {phase}: {time.monotonic() - t0:.1f} s\n")
        if rc != 0:
            lines = build_log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            raise KernelBuildError(
                f"kernel build failed at '{phase}' (exit {rc}); last lines of the log:\n"
                + "\n".join(lines)
            )

    log(f"kernel: building {key} in {tmp}")
    log(f"kernel: extracting {SOURCE_TARBALL.name}")
    run("extract", "tar", "-xf", str(SOURCE_TARBALL), "-C", str(src), "--strip-components=1")
    phase_done = time.monotonic()
    log(f"kernel: extracted in {phase_done - started:.0f} s; configuring tinyconfig + "
        "kvm_guest.config + kernel.fragment")
    run("tinyconfig", "make", f"ARCH={ARCH}", "tinyconfig")
    run("kvm_guest.config", "make", f"ARCH={ARCH}", "kvm_guest.config")
    # A file in arch/x86/configs/ becomes a `make <name>.config` target: merge_config.sh -m,
    # then olddefconfig, exactly like kvm_guest.config.
    (src / "arch/x86/configs/aenv.config").write_text(fragment)
    run("aenv.config", "make", f"ARCH={ARCH}", "aenv.config")
    config_text = (src / ".config").read_text()
    if problems := verify_config(fragment, config_text):
        raise KernelBuildError(
            f"kernel fragment options missing from the final .config ({len(problems)}; "
            "a dependency is off or the symbol no longer exists): " + "; ".join(problems)
        )
    log(f"kernel: configured in {time.monotonic() - phase_done:.0f} s; compiling bzImage "
        f"with -j{jobs} (output in {build_log})")
    phase_done = time.monotonic()
    run("bzImage", "make", f"-j{jobs}", f"ARCH={ARCH}", "bzImage")
    log(f"kernel: compiled in {time.monotonic() - phase_done:.0f} s")
    shutil.copy2(src / "arch/x86/boot/bzImage", out / "bzImage")
    shutil.copy2(src / "vmlinux", out / "vmlinux")  # for the Firecracker driver
    (out / ".config").write_text(config_text)
    shutil.copy2(build_log, out / "build.log")
    log(f"kernel: built in {time.monotonic() - started:.0f} s")
