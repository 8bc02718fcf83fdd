"""Object stores the snapshot store writes to: one small interface, two implementations.

Keys are `/`-separated names. A put is atomic (a reader sees the whole object or none):
S3 gives that; on a filesystem the object is written to a temporary file and renamed.
Objects larger than `MULTIPART_BYTES` go to S3 as multipart uploads (boto3's managed
transfer), in parts of that size.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Protocol

MULTIPART_BYTES = 8 << 20


class ObjectNotFound(Exception):
    pass


class ObjectStoreError(Exception):
    """The store could not be reached or refused the request."""


class ObjectStore(Protocol):
    def has(self, key: str) -> bool: ...
    def get(self, key: str) -> bytes: ...  # ObjectNotFound
    def put(self, key: str, data: bytes) -> None: ...
    def delete(self, key: str) -> None: ...
    def keys(self, prefix: str) -> list[str]: ...


class FsObjects:
    """Objects as files under `root` (a shared filesystem every node mounts)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad object key {key!r}")
        return self.root / key

    def has(self, key: str) -> bool:
        return self._path(key).is_file()

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(key) from None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".put-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def keys(self, prefix: str) -> list[str]:
        base = self.root
        return sorted(str(p.relative_to(base)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith(".put-")
                      and str(p.relative_to(base)).startswith(prefix))  # fmt: skip


class S3Objects:
    """Objects in an S3 bucket (AWS, or any S3-compatible endpoint: MinIO, Ceph, moto),
    under `prefix`. Credentials come from boto3's usual chain (environment, files)."""

    def __init__(self, bucket: str, *, prefix: str = "", endpoint_url: str | None = None,
                 region: str | None = None) -> None:  # fmt: skip
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config as BotoConfig

        self.bucket = bucket
        self.prefix = prefix
        self.client = boto3.client(
            "s3", endpoint_url=endpoint_url, region_name=region or "us-east-1",
            config=BotoConfig(retries={"max_attempts": 5, "mode": "standard"},
                              s3={"addressing_style": "path"}),
        )  # fmt: skip
        self.transfer = TransferConfig(multipart_threshold=MULTIPART_BYTES,
                                       multipart_chunksize=MULTIPART_BYTES)  # fmt: skip

    def _errors(self):  # type: ignore[no-untyped-def]
        from botocore.exceptions import BotoCoreError, ClientError

        return BotoCoreError, ClientError

    def has(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise ObjectStoreError(str(e)) from None

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            out = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)
            return out["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise ObjectNotFound(key) from None
            raise ObjectStoreError(str(e)) from None

    def put(self, key: str, data: bytes) -> None:
        try:
            self.client.upload_fileobj(io.BytesIO(data), self.bucket, self.prefix + key,
                                       Config=self.transfer)  # fmt: skip
        except self._errors() as e:
            raise ObjectStoreError(str(e)) from None

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.prefix + key)
        except self._errors() as e:
            raise ObjectStoreError(str(e)) from None

    def keys(self, prefix: str) -> list[str]:
        out: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + prefix)
        for page in pages:
            out += [o["Key"][len(self.prefix):] for o in page.get("Contents", [])]
        return sorted(out)


def open_store(url: str, *, endpoint_url: str = "", region: str = "") -> ObjectStore | None:
    """The store a `[store]` url names: `s3://bucket/prefix`, `file:///dir`; "" is none."""
    if not url:
        return None
    if url.startswith("file://"):
        return FsObjects(Path(url.removeprefix("file://")))
    if url.startswith("s3://"):
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return S3Objects(bucket, prefix=prefix, endpoint_url=endpoint_url or None,
                         region=region or None)  # fmt: skip
    raise ValueError(f"store url {url!r}: expected s3://bucket[/prefix] or file:///dir")
