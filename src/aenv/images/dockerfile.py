"""A Dockerfile's text, and the files its COPY steps take as one tar, made into an E2B build
by the SDK the node already has: `Template.from_dockerfile` parses it exactly as for
`aenv template build -f`, and each COPY's files are archived and stored by the hash the SDK
gives them, as its upload would (`POST /v3/templates/dockerfile`, for the web console)."""

from __future__ import annotations

import contextlib
import json
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aenv.images.context import ContextError, ContextStore, check_archive


class DockerfileError(ValueError):
    """What cannot be built, in one line."""


@contextlib.contextmanager
def parsed(text: str, context: bytes | None) -> Iterator[Any]:
    """The SDK's template of `text`, its COPY sources in `context` (a tar, maybe gzipped),
    unpacked in a directory of its own for as long as this is open."""
    from e2b import Template

    with tempfile.TemporaryDirectory(prefix="aenv-dockerfile-") as tmp:
        root = Path(tmp) / "context"
        root.mkdir()
        if context is not None:
            archive = Path(tmp) / "context.tar"
            archive.write_bytes(context)
            try:
                _unpack(archive, root)
            except (ContextError, tarfile.TarError, OSError) as e:
                raise DockerfileError(f"the build context: {e}") from None
        # The SDK takes a path or a text: a file, so that a text is never taken for a path.
        path = Path(tmp) / "Dockerfile"
        path.write_text(text)
        try:
            template = Template(file_context_path=str(root)).from_dockerfile(str(path))
        except Exception as e:  # whatever the SDK's parser fails on is the text's
            raise DockerfileError(f"the Dockerfile: {e or type(e).__name__}") from None
        if context is None and _copies(template):
            step = _copies(template)[0]
            raise DockerfileError(f"the Dockerfile: COPY/ADD {' '.join(step['args'][:2])}: "
                                  "it needs the build context's files")  # fmt: skip
        yield template


def spec(template: Any) -> dict[str, Any]:
    """The build as the SDK sends it (startTemplateBuild's body), files hashes included."""
    from e2b.template.main import TemplateBase

    try:
        out: dict[str, Any] = json.loads(TemplateBase.to_json(template))
    except Exception as e:  # its COPY sources, as the SDK hashes them
        raise DockerfileError(f"the Dockerfile: {e or type(e).__name__}") from None
    return out


def store_files(template: Any, contexts: ContextStore) -> int:
    """Each COPY step's files archived as the SDK's upload would be, under its hash, unless
    present: how many were stored."""
    from e2b.template.consts import GZIP, RESOLVE_SYMLINKS
    from e2b.template.utils import read_dockerignore, tar_file_stream

    t = template._template
    ignore = [*read_dockerignore(t._file_context_path), *t._file_ignore_patterns]
    stored = 0
    for step in t._instructions_with_hashes():
        if step["type"].value != "COPY" or contexts.present(step["filesHash"]):
            continue
        symlinks = step.get("resolveSymlinks")
        gzip = step.get("gzip")
        with tar_file_stream(step["args"][0], t._file_context_path, ignore,
                             RESOLVE_SYMLINKS if symlinks is None else symlinks,
                             GZIP if gzip is None else gzip) as archive:  # fmt: skip
            staged = contexts.staging(step["filesHash"])
            staged.write_bytes(archive.read())
        try:
            contexts.commit(staged, step["filesHash"])
        except ContextError as e:
            staged.unlink(missing_ok=True)
            raise DockerfileError(f"the build context: {e}") from None
        stored += 1
    return stored


def _unpack(archive: Path, root: Path) -> None:
    """Files and directories only: a link in an uploaded context could make the host's own
    files part of a build."""
    check_archive(archive)  # what builds take: nothing leaves its directory
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for m in members:
            if not (m.isfile() or m.isdir()):
                raise ContextError(f"{m.name!r}: only files and directories are taken")
        for m in members:
            m.mode = (m.mode & 0o755) | (0o755 if m.isdir() else 0o644)
            tar.extract(m, root, set_attrs=False)


def _copies(template: Any) -> list[dict[str, Any]]:
    return [s for s in template._template._instructions if s["type"].value == "COPY"]
