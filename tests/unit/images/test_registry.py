"""What skopeo is told: mirrors in order before the registry, plain HTTP only where allowed,
credentials for the registry itself only, and its errors sorted into kinds."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv import config
from aenv.images.reference import parse
from aenv.images.registry import (
    Credentials,
    RegistryError,
    RegistrySettings,
    Skopeo,
    _classify,
    _last_line,
)


def test_mirrors_come_first_then_the_registry(tmp_path: Path) -> None:
    s = Skopeo(RegistrySettings(mirrors={"docker.io": ["http://127.0.0.1:5000",
                                                       "https://mirror.example/hub/"]}),
               tmp_path)  # fmt: skip
    c = s.candidates(parse("ubuntu:22.04"))
    assert [str(x.ref) for x in c] == [
        "127.0.0.1:5000/library/ubuntu:22.04",
        "mirror.example/hub/library/ubuntu:22.04",
        "docker.io/library/ubuntu:22.04",
    ]
    assert [(x.plain_http, x.mirror) for x in c] == [(True, True), (False, True), (False, False)]
    assert [str(x.ref) for x in s.candidates(parse("ghcr.io/a/b"))] == ["ghcr.io/a/b:latest"]


def test_plain_http_only_for_loopback_and_listed_registries(tmp_path: Path) -> None:
    s = Skopeo(RegistrySettings(insecure=["registry.lan:5000"]), tmp_path)
    plain = {r: s.candidates(parse(r))[-1].plain_http
             for r in ("127.0.0.1:5000/a", "localhost/a", "registry.lan:5000/a", "ghcr.io/a")}
    assert plain == {"127.0.0.1:5000/a": True, "localhost/a": True, "registry.lan:5000/a": True,
                     "ghcr.io/a": False}  # fmt: skip


def test_credentials_go_to_the_registry_in_a_private_file_never_on_the_command_line(
        tmp_path: Path) -> None:
    s = Skopeo(RegistrySettings(mirrors={"docker.io": ["http://127.0.0.1:5000"]}), tmp_path)
    mirror, origin = s.candidates(parse("private/repo"))
    creds = Credentials("alice", "s3cret")
    with s._src_args(mirror, creds) as args:
        assert "--src-no-creds" in args and not any("s3cret" in a for a in args)
    with s._src_args(origin, creds) as args:
        assert not any("s3cret" in a or "alice" in a for a in args)
        auth = Path(next(a for a in args if a.startswith("--src-authfile=")).split("=", 1)[1])
        assert auth.stat().st_mode & 0o777 == 0o600
        assert "docker.io" in auth.read_text()
    assert not auth.exists()


def test_a_bad_mirror_url_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(RegistryError) as e:
        Skopeo(RegistrySettings(mirrors={"docker.io": ["ftp:// nope"]}), tmp_path)
    assert e.value.kind == "bad_config"


@pytest.mark.parametrize(("stderr", "kind"), [
    ('time="x" level=fatal msg="reading manifest t in r/x: manifest unknown: manifest unknown"',
     "not_found"),
    ("initializing source docker://r/x:1: reading manifest 1 in r/x: unauthorized: "
     "authentication required", "unauthorized"),
    ("dial tcp 127.0.0.1:1: connect: connection refused", "unreachable"),
    ("writing blob: Digest did not match, expected sha256:aa, got sha256:bb", "corrupt"),
    # The hex of a digest may hold "404" or "401": still the error it names.
    ("writing blob: Digest did not match, expected sha256:1c404e, got sha256:9a401b", "corrupt"),
    ("reading blob sha256:e404f: fetching blob: StatusCode: 404, 404 page not found",
     "not_found"),
    ("something else entirely", "unknown"),
])  # fmt: skip
def test_skopeo_errors_are_sorted_into_kinds(stderr: str, kind: str) -> None:
    assert _classify(stderr) == kind
    assert "\n" not in _last_line(stderr + "\n")


def test_mirrors_from_the_environment() -> None:
    cfg = config.load(env={"AENV_REGISTRY_MIRRORS": "docker.io=http://a:5000, http://b;ghcr.io=c"})
    assert cfg.registry.mirrors == {"docker.io": ["http://a:5000", "http://b"], "ghcr.io": ["c"]}
    assert config.load(env={}).images_dir == config.load(env={}).data_dir / "images"
