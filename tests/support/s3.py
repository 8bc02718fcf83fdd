"""A loopback S3 for the tests: moto in server mode, reached only through boto3 and an
endpoint URL (a production S3, MinIO or Ceph endpoint is a configuration change)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.host import free_port

MOTO = Path(sys.executable).with_name("moto_server")


@dataclass(frozen=True)
class S3:
    endpoint_url: str


@contextlib.contextmanager
def moto_s3() -> Iterator[S3]:
    # Fake credentials: boto3 must sign requests, and must never find real ones here.
    env = {"AWS_ACCESS_KEY_ID": "aenv-test", "AWS_SECRET_ACCESS_KEY": "aenv-test",
           "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    port = free_port()
    proc = subprocess.Popen([str(MOTO), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(url + "/moto-api/", timeout=1)
                break
            assert proc.poll() is None, "moto_server exited"
            assert time.monotonic() < deadline, "moto_server did not start"
            time.sleep(0.1)
        yield S3(url)
    finally:
        proc.terminate()
        proc.wait(10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
