"""`aenv upload` and `aenv download`: files and directories, like `scp -r`.

A file goes to the path given, or into it when that is an existing directory; a directory is
copied as a whole (into the destination when that exists, else as it). Relative sandbox paths
are relative to the sandbox user's home. Permission bits are kept both ways. On upload
symbolic links are followed (their targets are copied); on download they are recreated, but
never written through: the names in a downloaded directory come from the (untrusted) sandbox,
so every local path is checked to stay inside the destination, whatever symlinks it already
holds, and files are opened with O_NOFOLLOW. `-` as the local side means stdin (upload) or
stdout (download) for a single file.

A progress bar shows on a terminal (stderr) only. Ctrl-C stops the copy with one line saying
how far it got.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import httpx
import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from aenv.cli import output
from aenv.cli.client import Node
from aenv.cli.envd import Envd, EnvdError, file_type
from aenv.cli.errors import EXIT_INTERRUPTED, CliError
from aenv.cli.sandboxes import SandboxId, open_envd, running_sandbox

CHUNK = 1 << 20
DEFAULT_FILE_MODE = 0o644
CHMOD_BATCH = 200


class _Meter:
    """Bytes done, for a progress bar on a terminal and for the interrupt message."""

    def __init__(self, total: int, label: str) -> None:
        self.done = 0
        self.progress: Progress | None = None
        if output.err().is_terminal:
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                TransferSpeedColumn(), TimeRemainingColumn(),
                console=output.err(), transient=False,
            )  # fmt: skip
            self.task = self.progress.add_task(label, total=total)

    def __enter__(self) -> _Meter:
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress:
            self.progress.stop()

    def add(self, n: int) -> None:
        self.done += n
        if self.progress:
            self.progress.update(self.task, advance=n)

    def label(self, text: str) -> None:
        if self.progress:
            self.progress.update(self.task, description=text)


@dataclass
class _Plan:
    dirs: list[str] = field(default_factory=list)
    files: list[tuple[str, str, int, int]] = field(default_factory=list)  # src, dst, size, mode
    links: list[tuple[str, str]] = field(default_factory=list)  # target, dst
    root: Path | None = None  # a downloaded directory's local root: nothing is written outside

    @property
    def total(self) -> int:
        return sum(f[2] for f in self.files)


def _short(path: str, width: int = 40) -> str:
    return path if len(path) <= width else "..." + path[-(width - 3):]


# --- upload -----------------------------------------------------------------------------------


def _local_plan(local: Path, target: str) -> _Plan:
    plan = _Plan()
    if local.is_file():
        st = local.stat()
        plan.files.append((str(local), target, st.st_size, st.st_mode & 0o7777))
        return plan
    plan.dirs.append(target)
    for dirpath, dirnames, filenames in os.walk(local, followlinks=True):
        rel = Path(dirpath).relative_to(local)
        base = posixpath.join(target, *rel.parts) if rel.parts else target
        for d in sorted(dirnames):
            plan.dirs.append(posixpath.join(base, d))
        for name in sorted(filenames):
            p = Path(dirpath, name)
            try:
                st = p.stat()
            except OSError as e:
                raise CliError(f"cannot read {p}: {e.strerror}") from None
            if not p.is_file():
                continue  # sockets, fifos, devices, dangling links
            plan.files.append((str(p), posixpath.join(base, name), st.st_size, st.st_mode & 0o7777))
    return plan


def _read_chunks(f: BinaryIO, meter: _Meter) -> Iterator[bytes]:
    while True:
        chunk = f.read(CHUNK)
        if not chunk:
            return
        meter.add(len(chunk))
        yield chunk


def _chmod(envd: Envd, files: list[tuple[str, int]]) -> None:
    """Apply local permission bits in the sandbox (uploads create files 0644)."""
    by_mode: dict[int, list[str]] = {}
    for path, mode in files:
        if mode != DEFAULT_FILE_MODE:
            by_mode.setdefault(mode, []).append(path)
    lines = []
    for mode, paths in by_mode.items():
        for i in range(0, len(paths), CHMOD_BATCH):
            lines.append(f"chmod {mode:o} -- " + shlex.join(paths[i:i + CHMOD_BATCH]))
    for line in lines:
        with envd.start("/bin/sh", ["-c", line]) as events:
            for _ in events:
                pass


def upload(
    sandbox: SandboxId,
    local: Annotated[str, typer.Argument(help="Local file or directory ('-' = stdin).",
                                         metavar="LOCAL")],
    remote: Annotated[str, typer.Argument(help="Path in the sandbox.", metavar="REMOTE")],
) -> None:
    """Copy a local file or directory into a sandbox."""
    with Node() as node:
        detail = running_sandbox(node, sandbox, "copying files into it")
        with open_envd(node, detail) as envd:
            if local == "-":
                _upload_stdin(envd, remote)
                return
            src = Path(local).expanduser()
            if not src.exists():
                raise CliError(f"no such file or directory: {local}")
            into = remote.endswith("/")
            st = envd.stat(remote)
            is_dir = st is not None and file_type(st) == "dir"
            if src.is_dir() and st is not None and not is_dir:
                raise CliError(f"{remote} exists in the sandbox and is not a directory")
            target = posixpath.join(remote, src.resolve().name) if (is_dir or into) else remote
            plan = _local_plan(src, target.rstrip("/") or "/")
            _run_upload(envd, plan, detail["sandboxID"])


def _upload_stdin(envd: Envd, remote: str) -> None:
    with _Meter(0, "stdin") as meter:
        try:
            envd.upload(remote, _read_chunks(sys.stdin.buffer, meter))
        except KeyboardInterrupt:
            raise CliError(f"upload interrupted after {output.size(meter.done)}: {remote} in "
                           "the sandbox may be incomplete", EXIT_INTERRUPTED) from None  # fmt: skip


def _run_upload(envd: Envd, plan: _Plan, sandbox_id: str) -> None:
    done = 0
    current = ""
    with _Meter(plan.total, "uploading") as meter:
        try:
            for d in plan.dirs:
                envd.make_dir(d)
            for src, dst, _, _ in plan.files:
                current = dst
                meter.label(_short(dst))
                with open(src, "rb") as f:
                    envd.upload(dst, _read_chunks(f, meter))
                done += 1
            current = ""
            _chmod(envd, [(dst, mode) for _, dst, _, mode in plan.files])
        except KeyboardInterrupt:
            where = f"; {current} in sandbox {sandbox_id} may be incomplete" if current else ""
            raise CliError(f"upload interrupted after {done} of {len(plan.files)} files "
                           f"({output.size(meter.done)}){where}", EXIT_INTERRUPTED) from None
        except OSError as e:
            raise CliError(f"cannot read {e.filename or current}: {e.strerror}") from None
        except EnvdError as e:
            raise CliError(f"uploading {current or 'files'} failed: {e.message}") from None
        except httpx.HTTPError as e:
            raise CliError(f"uploading {current or 'files'} to sandbox {sandbox_id} failed: "
                           f"{type(e).__name__}: {e}") from None


# --- download ---------------------------------------------------------------------------------


def _remote_plan(envd: Envd, remote: str, entry: dict[str, Any], target: Path) -> _Plan:
    plan = _Plan()
    if file_type(entry) != "dir":
        plan.files.append((entry.get("path") or remote, str(target),
                           int(entry.get("size") or 0), int(entry.get("mode") or 0o644) & 0o777))
        return plan
    root = (entry.get("path") or remote).rstrip("/") or "/"
    plan.dirs.append(str(target))
    plan.root = target
    for e in envd.list_dir(root, depth=1 << 16):
        path = str(e.get("path", ""))
        rel = posixpath.relpath(path, root)
        if rel.startswith(".."):
            continue
        dst = str(target.joinpath(*rel.split("/")))
        if e.get("symlinkTarget") is not None and e.get("isSymlink", True):
            plan.links.append((str(e["symlinkTarget"]), dst))
        elif file_type(e) == "dir":
            plan.dirs.append(dst)
        elif file_type(e) == "file":
            plan.files.append((path, dst, int(e.get("size") or 0),
                               int(e.get("mode") or 0o644) & 0o777))  # fmt: skip
    return plan


def download(
    sandbox: SandboxId,
    remote: Annotated[str, typer.Argument(help="File or directory in the sandbox.",
                                          metavar="REMOTE")],
    local: Annotated[str, typer.Argument(
        help="Local destination ('-' = stdout for a file) [default: the current directory]",
        metavar="[LOCAL]", show_default=False)] = ".",
) -> None:
    """Copy a file or directory out of a sandbox."""
    with Node() as node:
        detail = running_sandbox(node, sandbox, "copying files out of it")
        with open_envd(node, detail) as envd:
            entry = envd.stat(remote)
            if entry is None:
                raise CliError(f"no such file or directory in sandbox {detail['sandboxID']}: "
                               f"{remote}")  # fmt: skip
            name = posixpath.basename((entry.get("path") or remote).rstrip("/")) or "root"
            if local == "-":
                if file_type(entry) == "dir":
                    raise CliError(f"{remote} is a directory: give a local path to copy it to")
                _download_stdout(envd, entry.get("path") or remote)
                return
            dest = Path(local).expanduser()
            target = dest / name if dest.is_dir() else dest
            if file_type(entry) == "dir" and target.exists() and not target.is_dir():
                raise CliError(f"{target} exists and is not a directory")
            plan = _remote_plan(envd, remote, entry, target)
            _run_download(envd, plan, detail["sandboxID"])


def _confined(path: str, root: Path | None, *, leaf: bool = True) -> str:
    """`path` (its directory, for a `leaf` that must not itself be followed), once the
    symlinks already on disk are resolved, must stay under `root`: a symlink an earlier
    download left must not redirect this one out of the destination."""
    if root is not None:
        real_root = os.path.realpath(root)
        real = os.path.realpath(os.path.dirname(path) if leaf else path)
        if os.path.commonpath([real_root, real]) != real_root:
            raise CliError(f"refusing to write {path}: a symlink in the destination leads "
                           f"outside {root}")  # fmt: skip
    return path


def _create(path: str, root: Path | None) -> BinaryIO:
    """Open for writing without following a symlink at `path` itself (for directory
    downloads; a single file goes where the user said, as with cp)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_NOFOLLOW if root else 0)
    return os.fdopen(os.open(_confined(path, root), flags, 0o644), "wb")


def _download_stdout(envd: Envd, path: str) -> None:
    out = sys.stdout.buffer
    with envd.download(path) as r:
        for chunk in r.iter_bytes(CHUNK):
            out.write(chunk)
    out.flush()


def _run_download(envd: Envd, plan: _Plan, sandbox_id: str) -> None:
    done = 0
    current = ""
    with _Meter(plan.total, "downloading") as meter:
        try:
            for d in plan.dirs:
                Path(_confined(d, plan.root, leaf=False)).mkdir(parents=True, exist_ok=True)
            for src, dst, _, mode in plan.files:
                current = dst
                meter.label(_short(src))
                Path(_confined(dst, plan.root)).parent.mkdir(parents=True, exist_ok=True)
                with envd.download(src) as r, _create(dst, plan.root) as f:
                    for chunk in r.iter_bytes(CHUNK):
                        f.write(chunk)
                        meter.add(len(chunk))
                with contextlib.suppress(OSError):
                    os.chmod(dst, mode)
                done += 1
            current = ""
            for link_target, dst in plan.links:
                with contextlib.suppress(FileExistsError):
                    os.symlink(link_target, _confined(dst, plan.root))
        except KeyboardInterrupt:
            where = f"; {current} is incomplete" if current else ""
            raise CliError(f"download interrupted after {done} of {len(plan.files)} files "
                           f"({output.size(meter.done)}){where}", EXIT_INTERRUPTED) from None
        except OSError as e:
            raise CliError(f"cannot write {e.filename or current}: {e.strerror}") from None
        except EnvdError as e:
            raise CliError(f"downloading from sandbox {sandbox_id} failed: {e.message}") from None
        except httpx.HTTPError as e:
            raise CliError(f"downloading from sandbox {sandbox_id} failed: "
                           f"{type(e).__name__}: {e}") from None
