"""Registry access through skopeo (containers/image): the OCI distribution protocol, auth
(anonymous, basic, bearer tokens from a `WWW-Authenticate` realm), manifest lists resolved to
linux/amd64, Docker schema 2 and OCI media types, gzip/zstd/plain layers, digest checks,
concurrent layer downloads and retries. aenv only decides what skopeo is told: which
registries may be plain HTTP, the mirrors, the credentials and the extra CA.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv.images.reference import Reference

log = logging.getLogger(__name__)

SKOPEO = "skopeo"
INSPECT_TIMEOUT_S = 120
COPY_TIMEOUT_S = 3600
RETRIES = 3
# A copy cut part-way is run again (after 1 s, then 2 s, ...): the blobs it finished are in
# the layout, so only the rest is fetched.
COPY_ATTEMPTS = 4
# skopeo has no structured errors: these phrases of containers/image's messages say which
# failure it was, so the API can answer 404/401/502/422 rather than one opaque 500.
_KINDS = [
    ("unauthorized", re.compile(r"unauthorized|authentication required|401 Unauthorized|"
                                r"invalid username/password|denied", re.I)),  # fmt: skip
    # Before not_found: its messages quote digests, whose hex may hold "404".
    ("corrupt", re.compile(r"digest did not match|Digest did not match|unexpected digest|"
                           r"size mismatch|invalid checksum|blob size", re.I)),  # fmt: skip
    ("not_found", re.compile(r"manifest unknown|name unknown|not found|\b404\b|"
                             r"no image found in manifest list|choosing image instance", re.I)),
    # A transfer cut part-way (skopeo's own retries do not cover a body cut short).
    ("interrupted", re.compile(r"happened during read|unexpected EOF|connection reset by peer|"
                               r"broken pipe", re.I)),  # fmt: skip
    ("unreachable", re.compile(r"connection refused|no such host|i/o timeout|"
                               r"network is unreachable|server gave HTTP response to HTTPS|"
                               r"tls:|x509:|EOF|connection reset", re.I)),  # fmt: skip
]


class RegistryError(Exception):
    """A pull or inspect that failed; `kind` is one of unauthorized, not_found, corrupt,
    interrupted, unreachable, bad_config or unknown."""

    def __init__(self, message: str, kind: str = "unknown") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


@dataclass
class RegistrySettings:
    """The node's registry configuration (`[registry]` in the config file)."""

    # Docker's registry-mirrors: "docker.io" -> ["http://127.0.0.1:5000", ...]
    mirrors: dict[str, list[str]] = field(default_factory=dict)
    # Registries (host[:port]) allowed over plain HTTP besides loopback ones.
    insecure: list[str] = field(default_factory=list)
    auth_file: Path | None = None  # a Docker config.json
    ca_file: Path | None = None  # trusted besides the system CA store
    # Loopback registries may be plain HTTP (and unverified HTTPS), as with Docker.
    insecure_loopback: bool = True


@dataclass(frozen=True)
class Layer:
    digest: str
    size: int
    media_type: str


@dataclass(frozen=True)
class RemoteImage:
    """What a registry says of an image (for linux/amd64) before anything is pulled."""

    reference: Reference  # as asked for
    source: Reference  # where it was found: the registry itself or one of its mirrors
    digest: str  # of the manifest or index the tag points at
    manifest_digest: str  # of the linux/amd64 image manifest
    layers: tuple[Layer, ...]

    @property
    def size(self) -> int:
        return sum(layer.size for layer in self.layers)


def _classify(stderr: str) -> str:
    for kind, pattern in _KINDS:
        if pattern.search(stderr):
            return kind
    return "unknown"


def _last_line(stderr: str) -> str:
    """skopeo's error as one line, without its logging frame and wrapper."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    msg = lines[-1] if lines else "skopeo failed"
    msg = re.sub(r'^time="[^"]*" level=\w+ msg="(.*)"$', r"\1", msg).replace('\\"', '"')
    return re.sub(r'^(Error parsing image name|initializing source) "[^"]*": ', "", msg)


_INDEX_TYPES = {"application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json"}
_MANIFEST_TYPES = {"application/vnd.oci.image.manifest.v1+json",
                   "application/vnd.docker.distribution.manifest.v2+json"}


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        raise RegistryError(f"{what} is not JSON", "corrupt") from None
    if not isinstance(doc, dict):
        raise RegistryError(f"{what} is not a JSON object", "corrupt")
    return doc


def _amd64(index: dict[str, Any], ref: Reference) -> str:
    """The linux/amd64 entry of a manifest list or OCI index."""
    found = []
    for m in index.get("manifests") or []:
        p = m.get("platform") or {}
        if p.get("os") == "linux" and p.get("architecture") == "amd64":
            found.append(str(m.get("digest")))
    if not found:
        arches = sorted({f"{(m.get('platform') or {}).get('os')}/"
                         f"{(m.get('platform') or {}).get('architecture')}"
                         for m in index.get("manifests") or []})  # fmt: skip
        raise RegistryError(f"{ref} has no linux/amd64 image (it has {', '.join(arches)})",
                            "not_found")  # fmt: skip
    return found[0]


@dataclass(frozen=True)
class _Candidate:
    ref: Reference
    plain_http: bool
    mirror: bool


def _mirror_location(url: str) -> tuple[str, bool]:
    """A mirror URL as containers/image wants it (host[:port][/path]) and whether it is plain
    HTTP."""
    m = re.fullmatch(r"(?:(https?)://)?([^/\s]+)(/[^\s]*)?", url.strip().rstrip("/"))
    if not m:
        raise RegistryError(f"registry mirror {url!r} is not a URL", "bad_config")
    return m.group(2) + (m.group(3) or ""), m.group(1) == "http"


class Skopeo:
    """One node's skopeo settings: a policy file (signatures are not checked; digests are),
    the extra CA, and the mirrors, tried in order before the registry itself as Docker's
    registry-mirrors are (containers/image's own mirror config is not read from a file of
    ours by the skopeo Debian ships)."""

    def __init__(self, settings: RegistrySettings, workdir: Path) -> None:
        self.settings = settings
        workdir.mkdir(parents=True, exist_ok=True)
        self.policy = workdir / "policy.json"
        self.certs = workdir / "certs"
        self.policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        if settings.ca_file is not None:
            self.certs.mkdir(exist_ok=True)
            (self.certs / "ca.crt").write_bytes(settings.ca_file.read_bytes())
        self.mirrors: dict[str, list[tuple[str, str, bool]]] = {}  # registry -> host, path, plain
        for registry, urls in settings.mirrors.items():
            for url in urls:
                location, plain = _mirror_location(url)
                host, _, path = location.partition("/")
                self.mirrors.setdefault(registry, []).append((host, path.strip("/"), plain))

    def _plain_http_ok(self, registry: str) -> bool:
        loopback = self.settings.insecure_loopback and Reference(registry, "x").is_loopback
        return loopback or registry in self.settings.insecure

    def candidates(self, ref: Reference) -> list[_Candidate]:
        out = []
        for host, path, plain in self.mirrors.get(ref.registry, []):
            repo = f"{path}/{ref.repository}" if path else ref.repository
            out.append(_Candidate(Reference(host, repo, ref.tag, ref.digest),
                                  plain or self._plain_http_ok(host), True))  # fmt: skip
        out.append(_Candidate(ref, self._plain_http_ok(ref.registry), False))
        return out

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR", "LANG")}
        env.setdefault("HOME", "/root")
        return env

    @contextmanager
    def _src_args(self, cand: _Candidate, creds: Credentials | None) -> Iterator[list[str]]:
        ref = cand.ref
        args = [f"--src-tls-verify={'false' if cand.plain_http else 'true'}"]
        if self.settings.ca_file is not None:
            args.append(f"--src-cert-dir={self.certs}")
        if creds is not None and not cand.mirror:  # a request's credentials are for the origin
            # An auth file of our own, so the password is never on a command line (ps).
            with tempfile.TemporaryDirectory(prefix="aenv-auth-") as tmp:
                auth = Path(tmp, "auth.json")
                token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
                fd = os.open(auth, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    json.dump({"auths": {ref.registry: {"auth": token}}}, f)
                yield [*args, f"--src-authfile={auth}"]
            return
        if self.settings.auth_file is not None:
            args.append(f"--src-authfile={self.settings.auth_file}")
        else:
            args.append("--src-no-creds")
        yield args

    def _run(self, argv: list[str], timeout: float,
             on_line: Callable[[str], None] | None = None) -> bytes:
        cmd = [SKOPEO, "--policy", str(self.policy), *argv]
        try:
            p = subprocess.Popen(cmd, env=self._env(), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except FileNotFoundError:
            raise RegistryError("skopeo is not installed (scripts/install-host-deps.sh)",
                                "bad_config") from None  # fmt: skip
        out = bytearray()
        try:
            assert p.stdout is not None and p.stderr is not None
            for line in p.stdout:
                out += line
                if on_line is not None:
                    on_line(line.decode(errors="replace").rstrip("\n"))
            err = p.stderr.read().decode(errors="replace")
            p.wait(timeout)
        except BaseException:
            p.kill()
            p.wait()
            raise
        if p.returncode != 0:
            raise RegistryError(_last_line(err), _classify(err))
        return bytes(out)

    def _raw(self, cand: _Candidate, ref: Reference, creds: Credentials | None) -> bytes:
        with self._src_args(cand, creds) as src:
            src = [a.replace("--src-", "--", 1) for a in src]
            return self._run(["inspect", "--raw", "--retry-times", str(RETRIES), *src,
                              f"docker://{ref}"], INSPECT_TIMEOUT_S)  # fmt: skip

    def _inspect_at(self, cand: _Candidate, creds: Credentials | None) -> RemoteImage:
        ref = cand.ref
        raw = self._raw(cand, ref, creds)
        top = _sha256(raw)
        if ref.digest and top != ref.digest:
            raise RegistryError(f"{ref}: the registry sent a manifest of digest {top}", "corrupt")
        doc = _json(raw, f"the manifest of {ref}")
        manifest_digest, manifest = top, doc
        if doc.get("mediaType") in _INDEX_TYPES or "manifests" in doc:
            manifest_digest = _amd64(doc, ref)
            pinned = Reference(ref.registry, ref.repository, None, manifest_digest)
            raw = self._raw(cand, pinned, creds)
            if _sha256(raw) != manifest_digest:
                raise RegistryError(f"{pinned}: the manifest does not match its digest",
                                    "corrupt")  # fmt: skip
            manifest = _json(raw, f"the manifest of {pinned}")
        media = manifest.get("mediaType") or "application/vnd.oci.image.manifest.v1+json"
        if media not in _MANIFEST_TYPES or "layers" not in manifest:
            raise RegistryError(f"{ref}: unsupported manifest type {media} (Docker schema 2 and "
                                "OCI images are)", "not_found")  # fmt: skip
        try:
            layers = tuple(Layer(str(x["digest"]), int(x["size"]), str(x["mediaType"]))
                           for x in manifest["layers"])  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise RegistryError(f"{ref}: malformed manifest ({e})", "corrupt") from None
        return RemoteImage(ref, ref, top, manifest_digest, layers)

    def inspect(self, ref: Reference, creds: Credentials | None = None) -> RemoteImage:
        """The image's manifest digest and layers, from the first mirror that has it, else
        the registry itself."""
        misses = []
        for cand in self.candidates(ref):
            try:
                found = self._inspect_at(cand, creds)
            except RegistryError as e:
                if not cand.mirror or e.kind == "corrupt":
                    if misses:
                        raise RegistryError(f"{e} (mirrors: {'; '.join(misses)})", e.kind) from e
                    raise
                misses.append(f"{cand.ref.registry}: {e}")
                continue
            return RemoteImage(ref, cand.ref, found.digest, found.manifest_digest, found.layers)
        raise AssertionError("candidates() always ends with the registry itself")

    def copy_to_layout(self, image: RemoteImage, layout: Path, tag: str,
                       creds: Credentials | None = None,
                       on_line: Callable[[str], None] | None = None) -> None:
        """Pull the linux/amd64 image from where `inspect` found it, pinned at its manifest
        digest, into the OCI layout `layout` as `tag`. Blobs the layout holds already are not
        fetched again; every blob fetched is checked against its digest."""
        cand = next(c for c in self.candidates(image.reference) if c.ref == image.source)
        src = image.source
        pinned = Reference(src.registry, src.repository, None, image.manifest_digest)
        with self._src_args(cand, creds) as args:
            # Every layer is stored gzip-compressed: zstd and uncompressed ones are recompressed
            # on the way in (umoci 0.4 cannot read zstd, nor Python's tarfile for layered
            # pulls); gzip ones are stored as they come.
            for attempt in range(COPY_ATTEMPTS):
                try:
                    self._run(["copy", "--retry-times", str(RETRIES), "--dest-compress-format",
                               "gzip", *args, f"docker://{pinned}", f"oci:{layout}:{tag}"],
                              COPY_TIMEOUT_S, on_line)  # fmt: skip
                    return
                except RegistryError as e:
                    if e.kind != "interrupted" or attempt == COPY_ATTEMPTS - 1:
                        raise
                    log.info("pull of %s was cut (%s): trying again", pinned, e)
                    time.sleep(2**attempt)
