"""Pure helpers: path resolution, Basic auth, signed URLs, RFC 3339, ranges, encodings."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from aenv.guest.agent import kernel, signing
from aenv.guest.agent.asgi import HTTPError
from aenv.guest.agent.files_http import _parse_range, _wants_gzip
from aenv.guest.agent.users import (
    InvalidPathError,
    User,
    expand_and_resolve,
    normalize,
    username_from_basic_auth,
)

USER = User("user", 1000, 1000, "/home/user", (1000,))


@pytest.mark.parametrize(
    ("path", "workdir", "expected"),
    [
        ("", None, "/home/user"),
        ("", "/work", "/work"),
        ("~", None, "/home/user"),
        ("~/a/b", None, "/home/user/a/b"),
        ("rel/x.txt", None, "/home/user/rel/x.txt"),
        ("rel/../../x", None, "/home/x"),
        ("../../../../etc/passwd", None, "/etc/passwd"),
        ("/abs/./p/../q", None, "/abs/q"),
        ("//double//slash/", None, "/double/slash"),
        ("/..", None, "/"),
    ],
)
def test_expand_and_resolve(path: str, workdir: str | None, expected: str) -> None:
    assert expand_and_resolve(path, USER, workdir) == expected


def test_other_users_home_is_refused() -> None:
    with pytest.raises(InvalidPathError):
        expand_and_resolve("~root/x", USER, None)


def test_normalize_never_escapes_root() -> None:
    assert normalize("/../../..") == "/"


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("Basic " + base64.b64encode(b"root:").decode(), "root"),
        ("basic " + base64.b64encode(b"user:pw").decode(), "user"),
        ("Basic " + base64.b64encode(b":").decode(), None),
        ("Bearer xyz", None),
        ("Basic !!!", None),
        (None, None),
    ],
)
def test_basic_auth_username(header: str | None, name: str | None) -> None:
    assert username_from_basic_auth(header) == name


def test_signature_matches_the_sdk_formula() -> None:
    from e2b.sandbox import signature as sdk

    for user in (None, "root"):
        for exp in (None, 60):
            ours = signing.signature("/p/x", "read", user or "", "tok", None)
            if exp is None:
                assert ours == sdk.get_signature("/p/x", "read", user, "tok")["signature"]
            got = sdk.get_signature("/p/x", "write", user, "tok", exp)
            assert got["signature"] == signing.signature(
                "/p/x", "write", user or "", "tok", got["expiration"]
            )


def test_check_signature() -> None:
    sig = signing.signature("/f", "read", "", "tok", 2000)
    ok = {"path": "/f", "operation": "read", "username": None, "token": "tok"}
    assert signing.check_signature(**ok, presented=sig, expiration="2000", now=1000) is None
    assert signing.check_signature(**ok, presented=sig, expiration="2000", now=3000) == (
        "signature is already expired"
    )
    assert signing.check_signature(**ok, presented=sig + "x", expiration="2000", now=0)
    assert signing.check_signature(**ok, presented=None, expiration=None)
    wrong_op = dict(ok, operation="write")
    assert signing.check_signature(**wrong_op, presented=sig, expiration="2000", now=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-01T00:00:00Z", 1704067200.0),
        ("2024-01-01T01:00:00+01:00", 1704067200.0),
        ("2024-01-01T00:00:00.123456789Z", 1704067200.123456),
    ],
)
def test_parse_rfc3339(text: str, expected: float) -> None:
    assert kernel.parse_rfc3339(text) == pytest.approx(expected)


def test_parse_rfc3339_needs_a_zone() -> None:
    with pytest.raises(ValueError):
        kernel.parse_rfc3339("2024-01-01T00:00:00")


def test_ranges() -> None:
    assert _parse_range("bytes=0-3", 10) == (0, 4)
    assert _parse_range("bytes=5-", 10) == (5, 10)
    assert _parse_range("bytes=-4", 10) == (6, 10)
    assert _parse_range("bytes=8-100", 10) == (8, 10)
    assert _parse_range("bytes=0-1,3-4", 10) is None
    assert _parse_range("items=0-1", 10) is None
    with pytest.raises(HTTPError):
        _parse_range("bytes=10-", 10)


def test_gzip_only_when_it_is_the_sole_offer() -> None:
    assert _wants_gzip("gzip")
    assert not _wants_gzip("gzip, deflate")
    assert not _wants_gzip("")
    assert not _wants_gzip("br")


def test_user_lookups_are_cached_until_the_user_database_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aenv.guest.agent import users

    passwd, group = tmp_path / "passwd", tmp_path / "group"
    passwd.write_text("a\n")
    group.write_text("b\n")
    monkeypatch.setattr(users, "_DB_FILES", (str(passwd), str(group)))
    monkeypatch.setattr(users, "_cache", {})
    reads: list[str] = []
    real = users._lookup
    monkeypatch.setattr(users, "_lookup", lambda name: reads.append(name) or real(name))
    first = users.lookup_user("root")
    assert users.lookup_user("root") is first and reads == ["root"]
    group.write_text("b\nc\n")  # e.g. useradd, or a command that edits /etc/group
    assert users.lookup_user("root") == first and reads == ["root", "root"]
    with pytest.raises(users.UnknownUserError):
        users.lookup_user("no-such-user-here")
