"""The cluster's catalog of published snapshots: `<prefix>published/<snapshot id>`, one
`PublishedEntry` per snapshot in the snapshot store, written by the node that published it
once the store holds all of it, and deleted with the snapshot. Gateways read it to place a
create from a snapshot no live node holds; nodes read it to find what to fetch."""

from __future__ import annotations

from pydantic import BaseModel, Field, ValidationError


class PublishedEntry(BaseModel):
    snapshot_id: str
    names: list[str] = Field(default_factory=list)
    kind: str = "snapshot"  # "template": a template's build; "paused": a paused sandbox's
    memory_mib: int
    node: str  # where it was taken
    created_at: str = ""  # RFC 3339, as the snapshot's
    published_at: float = 0.0
    logical_bytes: int = 0

    def named(self, name: str) -> bool:
        return name == self.snapshot_id or name in self.names


def published_prefix(prefix: str) -> str:
    return f"{prefix}published/"


def published_key(prefix: str, snapshot_id: str) -> str:
    return published_prefix(prefix) + snapshot_id


def paused_key(prefix: str, sandbox_id: str) -> str:
    """`<prefix>paused/<sandbox id>`: a paused sandbox's published state (kind "paused"),
    deleted when it resumes or ends; while it exists the sandbox may resume on any node."""
    return f"{prefix}paused/{sandbox_id}"


def paused_prefix(prefix: str) -> str:
    return f"{prefix}paused/"


def parse_entry(raw: bytes) -> PublishedEntry | None:
    try:
        return PublishedEntry.model_validate_json(raw)
    except ValidationError:
        return None


def newest(entries: list[PublishedEntry], name: str) -> PublishedEntry | None:
    """The entry `name` names: by id, else the newest carrying it (as on one node)."""
    by_id = [e for e in entries if e.snapshot_id == name]
    if by_id:
        return by_id[0]
    named = [e for e in entries if name in e.names]
    return max(named, key=lambda e: (e.created_at, e.snapshot_id)) if named else None
