"""What a published snapshot is, in the store:

    chunks/<sha256>             one 4 MiB chunk of any file of any snapshot, by content
    snapshots/<id>.json         a `Published`: its files as chunk lists, its manifest,
                                and what a node must match to restore it
    paused/<sandbox id>.json    the same for a paused sandbox's state, with its record

A chunk is stored once however many snapshots (a template and everything made from it)
hold it. A manifest is written after every chunk it names, so a manifest in the store is
always complete.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from aenv.storage.checksums import CHUNK_SIZE, Digest


def chunk_key(digest: str) -> str:
    return f"chunks/{digest}"


def manifest_key(snapshot_id: str) -> str:
    return f"snapshots/{snapshot_id}.json"


def paused_key(sandbox_id: str) -> str:
    return f"paused/{sandbox_id}.json"


class Compat(BaseModel, frozen=True):
    """What must match on a node before it restores the snapshot."""

    qemu: str = ""  # QEMU version
    kernel: str = ""  # guest kernel cache key
    tools: str = ""  # tools drive cache key
    accel: str | None = None  # kvm or tcg: a KVM snapshot restores only under KVM...
    cpu: str | None = None  # ...on the same CPU model

    def mismatch(self, node: Compat) -> str | None:
        """Why a node described by `node` must not restore this snapshot (None: it may)."""
        for field in ("qemu", "kernel", "tools", "accel"):
            want, have = getattr(self, field), getattr(node, field)
            if want and have and want != have:
                return f"{field} differs (snapshot {want}, this node {have})"
        if self.accel == "kvm" and self.cpu and node.cpu and self.cpu != node.cpu:
            return f"CPU model differs (snapshot {self.cpu}, this node {node.cpu})"
        return None


class PublishedFile(BaseModel, frozen=True):
    size: int = Field(ge=0)
    chunks: tuple[Digest, ...]


class Published(BaseModel, frozen=True):
    format_version: Literal[1] = 1
    snapshot_id: str
    kind: Literal["snapshot", "template", "paused"] = "snapshot"
    chunk_size: int = CHUNK_SIZE
    files: dict[str, PublishedFile]
    manifest: dict[str, Any] = Field(default_factory=dict)  # the snapshot's manifest.json
    compat: Compat = Field(default_factory=Compat)
    # What a create from it takes from the template it was made from (envd version, env,
    # user, workdir): a node that lacks that template still gives its sandboxes the same.
    origin: dict[str, Any] = Field(default_factory=dict)
    # A paused sandbox's record (its settings, metadata, token): the node that resumes it
    # elsewhere takes it over as it was.
    sandbox: dict[str, Any] = Field(default_factory=dict)
    published_at: float = Field(default_factory=time.time)

    def logical_bytes(self) -> int:
        return sum(f.size for f in self.files.values())
