"""Docker's reference rules, as `docker pull` applies them."""

from __future__ import annotations

import pytest

from aenv.images.reference import BadReference, parse

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("text", "want"), [
    ("ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
    ("ubuntu", "docker.io/library/ubuntu:latest"),
    ("e2bdev/base", "docker.io/e2bdev/base:latest"),
    ("docker.io/ubuntu", "docker.io/library/ubuntu:latest"),
    ("index.docker.io/library/ubuntu:20.04", "docker.io/library/ubuntu:20.04"),
    ("ghcr.io/owner/repo/sub:v1.2", "ghcr.io/owner/repo/sub:v1.2"),
    ("localhost/img", "localhost/img:latest"),
    ("localhost:5000/a/b:t", "localhost:5000/a/b:t"),
    ("127.0.0.1:5000/a", "127.0.0.1:5000/a:latest"),
    (f"python@{DIGEST}", f"docker.io/library/python@{DIGEST}"),
    (f"python:3.12@{DIGEST}", f"docker.io/library/python:3.12@{DIGEST}"),
])  # fmt: skip
def test_references_normalise_as_docker_does(text: str, want: str) -> None:
    assert str(parse(text)) == want


def test_registry_host_and_loopback() -> None:
    assert parse("127.0.0.1:5000/a").is_loopback
    assert parse("localhost:5000/a").is_loopback
    assert parse("[::1]:5000/a").is_loopback
    assert not parse("ubuntu").is_loopback
    assert not parse("registry.example:5000/a").is_loopback
    assert parse("registry.example:5000/a").host == "registry.example"


@pytest.mark.parametrize("text", [
    "", "  ", "Ubuntu", "ubuntu:", "ubuntu:bad tag", "ubuntu@sha256:12", "http://x/y",
    "a//b", "-a", "ubuntu:" + "t" * 129, "x/" + "a" * 300,
])  # fmt: skip
def test_bad_references_say_why(text: str) -> None:
    with pytest.raises(BadReference) as e:
        parse(text)
    assert str(e.value)
