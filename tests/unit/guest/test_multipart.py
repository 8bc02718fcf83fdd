"""The streaming multipart parser, fed at every possible split point."""

from __future__ import annotations

import httpx
import pytest

from aenv.guest.agent.multipart import (
    PART_END,
    MultipartError,
    MultipartParser,
    PartStart,
    boundary_of,
    parse_header_params,
)


def _body(files: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    req = httpx.Request("POST", "http://x/files", files=[("file", f) for f in files])
    return req.read(), req.headers["content-type"]


def _parse(body: bytes, content_type: str, split: int | None = None) -> list[tuple[dict, bytes]]:
    parser = MultipartParser(boundary_of(content_type))
    chunks = [body] if split is None else [body[:split], body[split:]]
    parts: list[tuple[dict, bytes]] = []
    for chunk in chunks:
        for ev in parser.feed(chunk):
            if isinstance(ev, PartStart):
                parts.append((ev.headers, b""))
            elif ev is PART_END:
                continue
            else:
                headers, data = parts[-1]
                parts[-1] = (headers, data + ev)
    assert parser.done
    return parts


def test_every_split_point_gives_the_same_parts() -> None:
    files = [("a/b.txt", b"hello\r\n--not-a-boundary"), ("/abs/c", b""), ("d", b"\x00" * 300)]
    body, ctype = _body(files)
    expected = _parse(body, ctype)
    assert [d for _h, d in expected] == [f[1] for f in files]
    for split in range(len(body) + 1):
        assert _parse(body, ctype, split) == expected


def test_filenames_keep_their_path_and_escapes() -> None:
    body, ctype = _body([('dir/we"ird\\name.txt', b"x")])
    ((headers, _data),) = _parse(body, ctype)
    _kind, params = parse_header_params(headers["content-disposition"])
    assert params["name"] == "file"
    assert params["filename"] == 'dir/we"ird\\name.txt'


def test_rfc5987_filename_star_wins() -> None:
    _kind, params = parse_header_params(
        'form-data; name="file"; filename="fallback"; filename*=UTF-8\'\'%E2%82%AC.txt'
    )
    assert params["filename"] == "€.txt"


def test_byte_at_a_time_feeding() -> None:
    body, ctype = _body([("one", b"1" * 100), ("two", b"2")])
    parser = MultipartParser(boundary_of(ctype))
    data = b""
    for i in range(len(body)):
        for ev in parser.feed(body[i : i + 1]):
            if isinstance(ev, bytes):
                data += ev
    assert parser.done and data == b"1" * 100 + b"2"


def test_malformed() -> None:
    with pytest.raises(MultipartError):
        boundary_of("multipart/form-data")
    parser = MultipartParser(b"XX")
    with pytest.raises(MultipartError):
        parser.feed(b"--XXgarbage\r\n")
