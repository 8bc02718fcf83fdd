"""Peer nodes as sources of a snapshot: its description and its chunks, over the node's
cluster routes (`api/internal.py`), authenticated by the cluster token. Chunks come as
HTTP range requests on the snapshot's files, each checked against its digest by the fetch.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx
from pydantic import ValidationError

from aenv.cluster import wire
from aenv.store.published import Published
from aenv.store.transfer import SourceFailed

TIMEOUT = httpx.Timeout(60.0, connect=5.0)


def doc_path(name: str) -> str:
    return f"{wire.INTERNAL_PREFIX}/snapshots/{quote(name, safe='')}"


def file_path(snapshot_id: str, file: str) -> str:
    return f"{wire.INTERNAL_PREFIX}/snapshot-files/{snapshot_id}/{file}"


async def describe(client: httpx.AsyncClient, url: str, name: str, token: str
                   ) -> Published | None:  # fmt: skip
    """What the peer at `url` holds as `name` (an id or a name); None if it holds none or
    cannot be reached."""
    try:
        r = await client.get(url + doc_path(name), headers={wire.TOKEN_HEADER: token},
                             timeout=TIMEOUT)  # fmt: skip
        if r.status_code != 200:
            return None
        return Published.model_validate_json(r.content)
    except (httpx.HTTPError, ValidationError):
        return None


class PeerChunks:
    """One peer's copy of one snapshot as a chunk source (used from a worker thread)."""

    def __init__(self, node: str, url: str, snapshot_id: str, token: str,
                 client: httpx.Client) -> None:  # fmt: skip
        self.name = f"peer:{node}"
        self.url, self.snapshot_id, self.token, self.client = url, snapshot_id, token, client

    def chunk(self, file: str, offset: int, length: int, digest: str) -> bytes | None:
        headers = {wire.TOKEN_HEADER: self.token, "range": f"bytes={offset}-{offset + length - 1}"}
        try:
            r = self.client.get(self.url + file_path(self.snapshot_id, file), headers=headers,
                                timeout=TIMEOUT)  # fmt: skip
        except httpx.HTTPError as e:
            raise SourceFailed(str(e) or type(e).__name__) from None
        if r.status_code == 404:
            return None
        if r.status_code != 206:
            raise SourceFailed(f"answered {r.status_code} to a range request")
        return r.content
