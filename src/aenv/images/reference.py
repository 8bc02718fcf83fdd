"""Image references with Docker's rules: `ubuntu:22.04` is `docker.io/library/ubuntu:22.04`.

`[registry[:port]/]repository[:tag][@digest]`. The first path component names a registry
only if it holds a `.` or a `:`, or is `localhost`; otherwise the image is on Docker Hub, where
a one-component repository lives under `library/`. No tag and no digest means `latest`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
_HUB_ALIASES = {"docker.io", "index.docker.io", "registry-1.docker.io"}
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
_DOMAIN = re.compile(r"(?:[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)*|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?")
MAX_NAME = 255


class BadReference(ValueError):
    """The text is not an image reference; the message says why."""


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port]; docker.io for Docker Hub
    repository: str  # library/ubuntu
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        s = self.name
        if self.tag:
            s += f":{self.tag}"
        if self.digest:
            s += f"@{self.digest}"
        return s

    @property
    def host(self) -> str:
        host = self.registry
        if host.startswith("["):
            return host[1:host.index("]")]
        return host.rsplit(":", 1)[0] if ":" in host else host

    @property
    def is_loopback(self) -> bool:
        """Docker allows plain HTTP to these without being told."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def has_registry(text: str) -> bool:
    """A registry host or a digest in it (what makes a create's template an image)."""
    first, slash, _ = text.partition("/")
    return "@" in text or (bool(slash) and ("." in first or ":" in first
                                            or first == "localhost"))  # fmt: skip


def image_key(text: str) -> str | None:
    """How the nodes name image `text` (a create's template that has a registry host or a
    digest), or None if it is no such reference."""
    if not has_registry(text):
        return None
    try:
        return str(parse(text))
    except BadReference:
        return None


def parse(text: str) -> Reference:
    ref = text.strip()
    if not ref:
        raise BadReference("an image reference is empty")
    if any(c.isspace() for c in ref) or "://" in ref:
        raise BadReference(f"{text!r} is not an image reference (REGISTRY/REPOSITORY[:TAG])")
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise BadReference(f"{text!r}: the digest must be sha256: and 64 hex digits")
    tag = None
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        ref, tag = ref[:colon], ref[colon + 1:]
        if not _TAG.fullmatch(tag):
            raise BadReference(f"{text!r}: {tag!r} is not a valid tag")
    parts = ref.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        registry, path = parts[0], parts[1:]
        if not _DOMAIN.fullmatch(registry):
            raise BadReference(f"{text!r}: {registry!r} is not a registry host")
    else:
        registry, path = DOCKER_HUB, parts
    if registry.lower() in _HUB_ALIASES:
        registry = DOCKER_HUB
        if len(path) == 1:
            path = ["library", *path]
    for c in path:
        if not _COMPONENT.fullmatch(c):
            raise BadReference(f"{text!r}: repository names are lowercase letters, digits and "
                               f"separators (. _ __ -), not {c!r}")  # fmt: skip
    repository = "/".join(path)
    if len(registry) + 1 + len(repository) > MAX_NAME:
        raise BadReference(f"{text!r}: the name is longer than {MAX_NAME} characters")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry, repository, tag, digest)
