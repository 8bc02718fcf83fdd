"""`aenv template ls|rm|build`.

`ls` and `rm` go through the node's API, and so does `build -f Dockerfile` (the E2B build
flow). `build --recipe/--from` is a node-local admin command: it runs as root on the node's
host and works on the node's data directory directly, like `aenv setup` does; a running node
sees the change at once. It uses `aenv.orchestrator.builder` with a runtime instance of its
own, so it never touches the running node's VMs, slots or cgroups.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import signal
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from aenv.cli import completion, output
from aenv.cli.client import ApiError, Node
from aenv.cli.errors import AenvTyper, CliError, each
from aenv.cli.sandboxes import JsonOpt, parse_mib

app = AenvTyper(help="List, remove and build templates.", no_args_is_help=True)

TemplateNames = Annotated[
    list[str], typer.Argument(help="Template names or ids.", metavar="NAME...",
                              autocompletion=completion.template_names, show_default=False),
]  # fmt: skip


def ls(as_json: JsonOpt = None) -> None:
    """List the node's templates."""
    with Node() as node:
        items = node.templates()
    if output.want_json(as_json):
        output.print_json(items)
        return
    rows = [
        [
            t.get("templateID", ""),
            ",".join(a for a in t.get("aliases", []) if a != t.get("templateID")) or "-",
            str(t.get("cpuCount", "")),
            f"{t.get('memoryMB', '')} MiB",
            f"{t.get('diskSizeMB', '')} MiB",
            t.get("envdVersion", "") or "-",
            t.get("buildStatus") or "ready",
            output.ago(t.get("createdAt")),
            t.get("source") or "-",
            output.size(int(t.get("sizeBytes") or 0)) if t.get("sizeBytes") else "-",
            output.size(int(t.get("sharedBytes") or 0)) if t.get("sizeBytes") else "-",
        ]
        for t in items
    ]
    output.print_table(
        ["TEMPLATE", "ALIASES", "CPU", "MEMORY", "DISK", "ENVD", "STATUS", "BUILT", "SOURCE",
         "SIZE", "SHARED"], rows
    )


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise CliError(f"`aenv {what}` runs on the node's host as root "
                       "(it works on the node's data directory)")  # fmt: skip


def rm(templates: TemplateNames) -> None:
    """Remove templates (through the node's API; not the default template). Sandboxes and
    snapshots made from them keep working: they have their own copies of its files."""
    with Node() as node:

        def one(name: str) -> None:
            try:
                node.call("DELETE", f"/templates/{quote(name, safe='')}", (200, 204),
                          what="removing templates")  # fmt: skip
            except ApiError as e:
                if e.status == 404 and not e.unsupported:
                    raise CliError(f"no such template: {name} (see `aenv template ls`)"
                                   ) from None  # fmt: skip
                raise
            output.print_lines([name])

        each(templates, one)


# --- build ------------------------------------------------------------------------------------

# A template's machine shape, for `template build` and `pull`.
CpuOpt = Annotated[int | None, typer.Option("--cpu", min=1, max=64, show_default=False,
                                            help="vCPUs [default: the node's default shape]")]
MemoryOpt = Annotated[str | None, typer.Option(
    "--memory", "-m", help="Guest RAM: 512, 2G [default: the node's default shape]",
    show_default=False)]
DiskOpt = Annotated[str | None, typer.Option(
    "--disk", help="Writable disk: 4096, 8G [default: the node's default shape]",
    show_default=False)]


def _tree_fingerprint(root: Path) -> str:
    """A cheap content key of a directory (paths, sizes, mtimes), for the rootfs cache."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath, name)
            with contextlib.suppress(OSError):
                st = p.lstat()
                h.update(f"{p.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:12]


def _extract_rootfs(tar: tarfile.TarFile, root: Path) -> None:
    if hasattr(tarfile, "tar_filter"):  # Python >= 3.11.4
        tar.extractall(root, filter="tar")
        return
    for m in tar.getmembers():
        parts = Path(m.name).parts
        if m.name.startswith("/") or ".." in parts:
            raise CliError(f"unsafe path in the archive: {m.name}")
        if m.islnk() and (m.linkname.startswith("/") or ".." in Path(m.linkname).parts):
            raise CliError(f"unsafe hard link in the archive: {m.name} -> {m.linkname}")
    tar.extractall(root)  # members checked above


@contextlib.contextmanager
def _source_tree(source: Path, scratch: Path) -> Iterator[tuple[Path, str]]:
    """(a directory holding the rootfs, a cache tag for it) for a directory or a tarball."""
    if source.is_dir():
        yield source, f"dir-{_tree_fingerprint(source)}"
        return
    if not source.is_file() or not tarfile.is_tarfile(source):
        raise CliError(f"--from {source}: not a directory or a tar archive")
    h = hashlib.sha256()
    with source.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    with tempfile.TemporaryDirectory(dir=scratch, prefix=".aenv-rootfs-") as tmp:
        root = Path(tmp, "root")
        root.mkdir()
        with tarfile.open(source) as tar:
            # A rootfs needs devices, setuid bits and absolute symlinks: trust the archive
            # (this runs as root on the admin's own file), but keep members inside `root`.
            _extract_rootfs(tar, root)
        yield root, f"tar-{h.hexdigest()[:12]}"


def build(
    name: Annotated[str, typer.Argument(help="Template name (name[:tag] with -f).")],
    context: Annotated[Path | None, typer.Argument(
        help="With -f: the build context (COPY sources) [default: the Dockerfile's directory]",
        show_default=False)] = None,
    dockerfile: Annotated[Path | None, typer.Option(
        "--file", "-f", help="Build this Dockerfile through the node's E2B build API (no root "
        "needed; the log streams; Ctrl-C cancels).", show_default=False)] = None,
    recipe: Annotated[str, typer.Option(
        "--recipe", "-r", help="Built-in recipe: debian, familiar, busybox, code-interpreter-v1, "
        "code-interpreter-minimal (docs/templates.md).")] = "debian",
    source: Annotated[Path | None, typer.Option(
        "--from", help="Build from this root filesystem: a directory or a tarball "
        "(.tar, .tar.gz, ...) instead of a recipe.", show_default=False)] = None,
    cpu: CpuOpt = None,
    memory: MemoryOpt = None,
    disk: DiskOpt = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if up to date.")] = False,
) -> None:
    """Build a template: from a Dockerfile through the node's API (-f), or on this host from a
    recipe or a root filesystem (root only; the node may be running)."""
    if dockerfile is not None:
        if source is not None or disk is not None:
            raise CliError("-f builds through the node's API: --from and --disk do not apply")
        from aenv.cli.dockerfile import build_dockerfile

        build_dockerfile(name, dockerfile, context, cpu, parse_mib(memory) if memory else None,
                         force)  # fmt: skip
        return
    if context is not None:
        raise CliError("a build context goes with -f Dockerfile")

    async def make(rt: Any, shape: Any, say: Callable[[str], None]) -> Any:
        from aenv.images import recipes
        from aenv.orchestrator.builder import build_template

        if source is None:
            # No --cpu, --memory or --disk: the recipe's own shape (else the node's default).
            given = shape if (cpu, memory, disk) != (None, None, None) else None
            return await recipes.build(rt, name, recipe, given, progress=say, force=force)
        with _source_tree(source.expanduser().resolve(), rt.cfg.templates_dir) as (root, tag):
            return await build_template(rt, name, tag, shape, progress=say, source=root,
                                        force=force)  # fmt: skip

    run_local_build("build", name, cpu, memory, disk, make)


Make = Callable[[Any, Any, Callable[[str], None]], Any]  # (runtime, shape, progress)


def run_local_build(verb: str, name: str, cpu: int | None, memory: str | None,
                    disk: str | None, make: Make) -> None:
    """Run `make(runtime, shape, progress)` with a runtime instance of this command's own
    (the node's slots, cgroups and VM dirs stay untouched); print the template's name."""
    _require_root(verb if verb == "pull" else f"template {verb}")
    if not name or "/" in name or name.startswith("."):
        raise typer.BadParameter(f"{name!r} is not a valid template name", param_hint="NAME")
    from aenv import config as node_config

    cfg = node_config.load()
    # No warm or primed pools: a build boots one VM, and a pool's VMs would only cost CPU
    # (and a failing pull would start and end them for nothing).
    cfg = cfg.model_copy(update={"instance": "build" + secrets.token_hex(2)[:3],
                                 "warm_pool_size": 0, "primed_pool_size": 0})
    shape = cfg.default_shape.model_copy(update={
        k: v for k, v in (("vcpus", cpu),
                          ("memory_mib", parse_mib(memory) if memory else None),
                          ("disk_mib", parse_mib(disk) if disk else None)) if v is not None
    })  # fmt: skip
    # The runtime's own warnings (e.g. slots other nodes hold) are not the user's business;
    # failures reach them as exceptions.
    logging.basicConfig(level=logging.ERROR, format="aenv: %(name)s: %(message)s")
    say, stop = output.build_progress()
    try:
        template = asyncio.run(_in_runtime(cfg, shape, name, make, say))
    except KeyboardInterrupt:
        raise CliError(f"interrupted: template {name} was not changed", 130) from None
    except asyncio.CancelledError:  # SIGTERM
        raise CliError(f"terminated: template {name} was not changed", 143) from None
    finally:
        stop()
    output.print_lines([template.name])


async def _in_runtime(cfg: Any, shape: Any, name: str,
                      make: Make,
                      say: Callable[[str], None]) -> Any:
    from aenv.images.reference import BadReference
    from aenv.images.registry import RegistryError
    from aenv.machines.runtime import Runtime
    from aenv.orchestrator.builder import BuildError
    from aenv.storage.datafs import DataFsError
    from aenv.storage.kernel import KernelBuildError
    from aenv.storage.rootfs import RootfsError
    from aenv.vmm.base import VmmError

    rt = Runtime(cfg)
    # SIGTERM ends the build as Ctrl-C does: its VM, slot and files go with it.
    main = asyncio.current_task()
    assert main is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        await rt.start()
        return await make(rt, shape, say)
    except (BadReference, RegistryError) as e:
        raise CliError(f"{name}: {e}") from None
    except (BuildError, KernelBuildError, RootfsError, DataFsError, VmmError) as e:
        raise CliError(f"building {name} failed: {e}") from None
    finally:
        await rt.close()
        shutil.rmtree(cfg.sandboxes_dir, ignore_errors=True)


app.command("ls")(ls)
app.command("rm")(rm)
app.command("build")(build)
