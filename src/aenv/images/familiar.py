"""The familiar `base`: what E2B's base image gives (Python 3 with pip and venv, Node.js with
npm, git, curl, a compiler toolchain), built the way a user builds a template: a Dockerfile,
`FROM` the minimal Debian's node-local image, sent by the unmodified E2B SDK to a node's
template build API.

The build VM needs no network: the packages the minimal image lacks (and everything they
depend on) are resolved and downloaded on the host, by the host's apt against the minimal
image's own dpkg status, and `COPY`d into the build context. Setup skips the build when the
Dockerfile, the package files and the minimal template are what the last build used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from aenv.images.reference import parse

MINIMAL_IMAGE = parse("localhost/aenv/base-minimal")
FAMILIAR_IMAGES = [parse("e2bdev/base"), parse("localhost/aenv/base")]
PACKAGES = ("python3-pip", "python3-venv", "python3-dev", "nodejs", "npm", "build-essential",
            "git", "curl", "wget", "unzip", "procps")  # fmt: skip
DOCKERFILE = f"""\
# aenv's familiar base: built by `aenv setup` through the E2B template build API.
FROM {MINIMAL_IMAGE}
USER root
COPY debs/ /tmp/aenv-debs/
RUN apt-get install -y -q --no-install-recommends /tmp/aenv-debs/*.deb \\
    && rm -rf /tmp/aenv-debs /var/cache/apt/archives/*.deb
USER user
WORKDIR /home/user
"""
SERVER_START_S = 300
BUILD_TIMEOUT_S = 3 * 3600


class FamiliarError(Exception):
    pass


def _check(argv: list[str], what: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
    p = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
    if p.returncode != 0:
        tail = p.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise FamiliarError(f"{what} failed: {' | '.join(tail) or f'exit {p.returncode}'}")
    return p


def _apt(status: Path, *args: str) -> list[str]:
    return ["apt-get", "-q", "-y", "--no-install-recommends", f"-oDir::State::status={status}",
            "-oDebug::NoLocking=1", *args, "install", *PACKAGES]  # fmt: skip


def _status(minimal_disk: Path, work: Path) -> Path:
    status = work / "status"
    status.write_bytes(_check(["debugfs", "-R", "cat /var/lib/dpkg/status", str(minimal_disk)],
                              "reading the minimal image's dpkg status").stdout)  # fmt: skip
    if b"Package: " not in status.read_bytes():
        raise FamiliarError(f"{minimal_disk} holds no dpkg status: not a Debian root")
    return status


APT_HINT = " (the host's apt lists: `apt-get update`)"


def resolve_packages(minimal_disk: Path, work: Path) -> list[str]:
    """The .deb files PACKAGES need beyond what the minimal image holds (name_version_arch,
    sorted), by the host's apt against the image's own dpkg status, with no download."""
    argv = _apt(_status(minimal_disk, work), "--print-uris", "-qq")
    try:
        out = _check(argv, "resolving the familiar base's packages").stdout.decode()
    except FamiliarError:  # lists never fetched or stale: fetch them once, as apt would ask
        _check(["apt-get", "update", "-qq"], "apt-get update")
        out = _check(argv, "resolving the familiar base's packages" + APT_HINT).stdout.decode()
    return sorted(line.split()[1] for line in out.splitlines() if line.startswith("'"))


def download_packages(minimal_disk: Path, work: Path) -> list[str]:
    """Those .deb files, into `work/debs`; their names."""
    archives = work / "archives"
    (archives / "partial").mkdir(parents=True)
    _check(_apt(_status(minimal_disk, work), "--download-only",
                f"-oDir::Cache::archives={archives}"),
           "downloading the familiar base's packages" + APT_HINT)  # fmt: skip
    debs = work / "debs"
    debs.mkdir()
    for f in archives.glob("*.deb"):
        f.rename(debs / f.name)
    shutil.rmtree(archives)
    (work / "status").unlink()
    return sorted(f.name for f in debs.glob("*.deb"))


def build_key(minimal_snapshot: str, debs: list[str]) -> str:
    return hashlib.sha256("\n".join([DOCKERFILE, minimal_snapshot, *debs]).encode()).hexdigest()


def write_context(work: Path) -> Path:
    (work / "Dockerfile").write_text(DOCKERFILE)
    return work / "Dockerfile"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving_node(log_file: Path) -> Iterator[str]:
    """`aenv server` of this install, on a free loopback port, for as long as the build;
    its URL. The node is this host's (its data directory and key)."""
    port = _free_port()
    aenv = Path(sys.executable).with_name("aenv")
    env = dict(os.environ, AENV_HOST="127.0.0.1", AENV_PORT=str(port))
    with log_file.open("ab") as out:
        proc = subprocess.Popen([str(aenv), "server"], env=env, stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                raise FamiliarError(f"the node for the build exited ({proc.returncode}): "
                                    f"see {log_file}")  # fmt: skip
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise FamiliarError(f"the node for the build did not serve in "
                                    f"{SERVER_START_S} s: see {log_file}")  # fmt: skip
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def build(context: Path, name: str, url: str, api_key: str,
          progress: Callable[[str], None]) -> None:
    """The E2B SDK's own Dockerfile build of `context` as template `name`."""
    from e2b import Template
    from e2b.exceptions import BuildException, FileUploadException, TemplateException

    template = Template(file_context_path=str(context)).from_dockerfile(
        str(context / "Dockerfile"))
    try:
        Template.build(template, name, api_url=url, api_key=api_key, request_timeout=600,
                       on_build_logs=lambda e: progress(str(getattr(e, "message", e))))
    except (BuildException, FileUploadException, TemplateException) as e:
        raise FamiliarError(f"building {name} failed: {e}") from None
