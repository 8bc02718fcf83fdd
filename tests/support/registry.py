"""Real registries and images made offline, for the images plane's tests.

`Registry` runs Debian's `docker-registry` (the CNCF distribution registry) on a free
loopback port, storing in a directory of the test's own. `OciImage` builds images with
`umoci` (layers from directories, config) and pushes them with `skopeo`, so nothing is
fetched from outside the machine.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support import daemons
from tests.support.host import free_port

REGISTRY_BIN = "/usr/bin/docker-registry"
REF_NAME = "org.opencontainers.image.ref.name"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
BUSYBOX = Path("/bin/busybox")
START_DEADLINE_S = 30


def have_tools() -> str | None:
    """Why these tests cannot run here, or None."""
    for tool in (REGISTRY_BIN, "skopeo", "umoci"):
        if not shutil.which(tool):
            return f"{tool} is not installed (scripts/install-host-deps.sh)"
    return None


@dataclass
class Registry:
    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    tls: tuple[Path, Path] | None = None  # certificate and key: HTTPS
    auth: str = ""  # a YAML flow mapping for `auth:` (htpasswd, token)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Registry:
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / "config.yml"
        tls = f", tls: {{certificate: {self.tls[0]}, key: {self.tls[1]}}}" if self.tls else ""
        conf.write_text(
            "version: 0.1\n"
            "log: {level: info, accesslog: {disabled: false}}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.root / 'data'}}}, "
            "delete: {enabled: true}}\n"
            f"http: {{addr: '{self.host}'{tls}}}\n"
            + (f"auth: {self.auth}\n" if self.auth else "")
        )
        log = (self.root / "registry.log").open("ab")
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(conf)], stdout=log,
                                     stderr=log, stdin=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "registry.log").read_text()
            try:
                scheme = "https" if self.tls else "http"
                r = httpx.get(f"{scheme}://{self.host}/v2/", timeout=1, verify=False)
                if r.status_code in (200, 401):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("docker-registry did not answer in time")

    def stop(self) -> None:
        daemons.stop(self.proc)

    def blob_gets(self, digest: str) -> int:
        """How many times a blob was fetched (GET; a HEAD only asks whether it exists)."""
        log = (self.root / "registry.log").read_text(errors="replace")
        return sum(1 for ln in log.splitlines()
                   if f"/blobs/{digest}" in ln and '"GET ' in ln)  # fmt: skip

    def blob_files(self) -> list[Path]:
        return sorted((self.root / "data").rglob("blobs/sha256/*/*/data"))


def run(argv: list[str]) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{argv[:3]} failed: {p.stderr[-2000:]}"
    return p.stdout


def busybox_tree(root: Path) -> Path:
    """A minimal busybox root filesystem with only root in /etc/passwd (no `user`, no bash)."""
    for d in ("bin", "etc", "tmp", "root"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    names = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True).stdout
    for name in names.split():
        if not (root / "bin" / name).exists():
            (root / "bin" / name).symlink_to("busybox")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    return root


@dataclass
class OciImage:
    """An image under construction in an OCI layout of its own, layer by layer."""

    layout: Path
    tag: str = "latest"
    fresh: bool = True

    def __post_init__(self) -> None:
        if self.fresh:
            run(["umoci", "init", "--layout", str(self.layout)])
            run(["umoci", "new", "--image", self.ref])

    def branch(self, tag: str) -> OciImage:
        """Another image in the same layout, starting from this one's layers (so the two
        share those blobs byte for byte)."""
        run(["umoci", "tag", "--image", self.ref, tag])
        return OciImage(self.layout, tag, fresh=False)

    @property
    def ref(self) -> str:
        return f"{self.layout}:{self.tag}"

    def layer(self, change: object) -> None:
        """A layer holding what `change(rootfs)` does to the tree so far (umoci diffs it:
        removed files become whiteouts)."""
        bundle = self.layout.parent / f"{self.layout.name}-bundle"
        shutil.rmtree(bundle, ignore_errors=True)
        run(["umoci", "unpack", "--image", self.ref, str(bundle)])
        change(bundle / "rootfs")  # type: ignore[operator]
        run(["umoci", "repack", "--image", self.ref, str(bundle)])
        shutil.rmtree(bundle)

    def insert_opaque(self, src: Path, target: str) -> None:
        run(["umoci", "insert", "--image", self.ref, "--opaque", str(src), target])

    def descriptor(self) -> dict[str, object]:
        index = json.loads((self.layout / "index.json").read_text())
        return next(m for m in index["manifests"]
                    if m.get("annotations", {}).get(REF_NAME) == self.tag)  # fmt: skip

    def index_of(self, tag: str, platforms: dict[str, OciImage]) -> OciImage:
        """A multi-platform image (an OCI index) in this layout: `arch -> image` of the
        same layout, each entry pointing at that image's manifest."""
        entries = []
        for arch, img in platforms.items():
            d = {k: v for k, v in img.descriptor().items() if k != "annotations"}
            entries.append({**d, "platform": {"os": "linux", "architecture": arch}})
        blob = json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE,
                           "manifests": entries}).encode()  # fmt: skip
        digest = hashlib.sha256(blob).hexdigest()
        (self.layout / "blobs/sha256" / digest).write_bytes(blob)
        index = json.loads((self.layout / "index.json").read_text())
        index["manifests"].append({"mediaType": INDEX_TYPE, "digest": f"sha256:{digest}",
                                   "size": len(blob), "annotations": {REF_NAME: tag}})
        (self.layout / "index.json").write_text(json.dumps(index))
        return OciImage(self.layout, tag, fresh=False)

    def push_all(self, registry: Registry, repo: str) -> str:
        """Push an index with every image it names."""
        dest = f"{registry.host}/{repo}"
        run(["skopeo", "--insecure-policy", "copy", "--all", "--dest-tls-verify=false",
             f"oci:{self.ref}", f"docker://{dest}"])  # fmt: skip
        return dest

    def config(self, *args: str) -> None:
        run(["umoci", "config", "--image", self.ref, *args])

    def push(self, registry: Registry, repo: str, creds: str | None = None) -> str:
        dest = f"{registry.host}/{repo}"
        run(["skopeo", "--insecure-policy", "copy", "--dest-tls-verify=false",
             *([f"--dest-creds={creds}"] if creds else []),
             f"oci:{self.ref}", f"docker://{dest}"])  # fmt: skip
        return dest


    def push_zstd(self, registry: Registry, repo: str) -> str:
        dest = f"{registry.host}/{repo}"
        run(["skopeo", "--insecure-policy", "copy", "--dest-tls-verify=false",
             "--dest-compress-format", "zstd", f"oci:{self.ref}", f"docker://{dest}"])  # fmt: skip
        return dest

    def push_uncompressed(self, registry: Registry, repo: str) -> str:
        """Push with every layer as a plain tar (skopeo would compress them), by the
        distribution API itself: monolithic blob uploads, then the manifest."""
        blobs = self.layout / "blobs/sha256"
        manifest = json.loads((blobs / self.descriptor()["digest"].split(":")[1]).read_bytes())
        base = f"http://{registry.host}/v2/{repo.split(':')[0]}"
        with httpx.Client(timeout=60) as c:
            def put(data: bytes) -> tuple[str, int]:
                digest = "sha256:" + hashlib.sha256(data).hexdigest()
                r = c.post(f"{base}/blobs/uploads/")
                assert r.status_code == 202, r.text
                url = httpx.URL(f"http://{registry.host}").join(r.headers["location"])
                r = c.put(url.copy_merge_params({"digest": digest}), content=data,
                          headers={"Content-Type": "application/octet-stream"})
                assert r.status_code == 201, r.text
                return digest, len(data)

            for layer in manifest["layers"]:
                raw = gzip.decompress((blobs / layer["digest"].split(":")[1]).read_bytes())
                layer["digest"], layer["size"] = put(raw)
                layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar"
            put((blobs / manifest["config"]["digest"].split(":")[1]).read_bytes())
            r = c.put(f"{base}/manifests/{repo.split(':')[1]}", content=json.dumps(manifest),
                      headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
            assert r.status_code == 201, r.text
        return f"{registry.host}/{repo}"


def set_xattr(path: Path, name: str, value: bytes) -> None:
    os.setxattr(path, name, value, follow_symlinks=False)


@dataclass
class Seeded:
    registry: Registry
    multi: str  # base + a layer with whiteout, hardlink, setuid, xattr, owner + opaque dir
    sibling: str  # the same base layer + a layer of its own
    hub_name: str  # sibling, pushed as library/ubuntu:22.04 for the docker.io mirror
    multiarch: str  # an index: amd64 -> multi, arm64 -> sibling
    arm_only: str  # an index with an arm64 image alone
    base: str  # multi's first layer alone: multi extends it
    # Stand-ins under the Docker Hub names the E2B SDK's template tests use (also sibling).
    hub_names: tuple[str, ...] = ("library/ubuntu:22.04", "e2bdev/base:latest")


def _base(root: Path) -> None:
    busybox_tree(root)
    (root / "etc/gone").write_text("removed by the next layer")
    (root / "opt/data").mkdir(parents=True)
    (root / "opt/data/old").write_text("hidden by an opaque directory")


def _delta(root: Path) -> None:
    (root / "etc/gone").unlink()
    (root / "srv").mkdir()
    (root / "srv/a").write_text("A")
    os.link(root / "srv/a", root / "srv/b")
    (root / "srv/suid").write_text("s")
    os.chmod(root / "srv/suid", 0o4755)
    (root / "srv/x").write_text("x")
    set_xattr(root / "srv/x", "user.aenv", b"ok")
    os.chown(root / "srv/a", 123, 456)
    (root / "srv/link").symlink_to("/etc/passwd")


@contextlib.contextmanager
def seeded_registry(work: Path) -> Iterator[Seeded]:
    """A registry holding the test images (built here, offline)."""
    reg = Registry(work / "registry").start()
    try:
        multi = OciImage(work / "layout", "multi")
        multi.layer(_base)
        base = multi.branch("base")
        sibling = multi.branch("sibling")
        multi.layer(_delta)
        newdata = work / "newdata"
        newdata.mkdir()
        (newdata / "new").write_text("new")
        multi.insert_opaque(newdata, "/opt/data")
        multi.config("--config.env", "FOO=bar", "--config.workingdir", "/work",
                     "--config.user", "1000")  # fmt: skip
        sibling.layer(lambda r: (r / "sibling").write_text("own"))
        hub = [sibling.push(reg, name) for name in Seeded.hub_names]
        both = multi.index_of("multiarch", {"arm64": sibling, "amd64": multi})
        arm = multi.index_of("armonly", {"arm64": sibling})
        yield Seeded(reg, multi.push(reg, "test/multi:1"), sibling.push(reg, "test/sibling:1"),
                     hub[0], both.push_all(reg, "test/multiarch:1"),
                     arm.push_all(reg, "test/armonly:1"),
                     base.push(reg, "test/base:1"))  # fmt: skip
    finally:
        reg.stop()


class DroppingProxy:
    """A TCP proxy on loopback in front of `upstream` that cuts the first connection whose
    answer passes `after` bytes (a dropped download), and forwards every other one."""

    def __init__(self, upstream: str, after: int) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.after = after
        self.dropped = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as up:
            def pump(src: socket.socket, dst: socket.socket, count: bool) -> None:
                sent = 0
                with contextlib.suppress(OSError):
                    while data := src.recv(65536):
                        sent += len(data)
                        if count and sent > self.after and not self.dropped:
                            self.dropped += 1
                            dst.sendall(data[: len(data) // 2])
                            break
                        dst.sendall(data)
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

            t = threading.Thread(target=pump, args=(client, up, False), daemon=True)
            t.start()
            pump(up, client, True)
            t.join(5)

    def close(self) -> None:
        self.sock.close()


def push_exported(registry: Registry, local_name: str, repo: str) -> str | None:
    """The node's own export `local_name` (`aenv setup`'s minimal Debian, images/export.py)
    pushed to `registry` as `repo`, digest kept: a Debian image a loopback registry serves,
    whose template the node already has (a build FROM it pulls and unpacks nothing). None if
    this data directory has no such export."""
    from tests.support.host import DATA_DIR

    images = DATA_DIR / "images"
    try:
        digest = json.loads((images / "local.json").read_text())[local_name]["digest"]
    except (OSError, ValueError, KeyError):
        return None
    run(["skopeo", "copy", "-q", "--preserve-digests", "--dest-tls-verify=false",
         f"oci:{images / 'oci'}:{digest.replace(':', '-')}",
         f"docker://{registry.host}/{repo}"])  # fmt: skip
    return f"{registry.host}/{repo}"
