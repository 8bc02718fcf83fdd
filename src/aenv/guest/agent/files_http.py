"""GET and POST /files: file download and upload over plain HTTP (e2b-compat.md 6.2)."""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat as st
import zlib
from collections.abc import Iterator
from urllib.parse import quote

from . import signing
from .asgi import HTTPError, Request, Send, send_json
from .entries import METADATA_XATTR_PREFIX
from .fsops import chown, ensure_dirs
from .multipart import (
    PART_END,
    MultipartError,
    MultipartParser,
    PartStart,
    boundary_of,
    parse_header_params,
)
from .state import SandboxState
from .users import InvalidPathError, UnknownUserError, User, expand_and_resolve
from .watchers import WatcherRegistry

READ_CHUNK = 256 * 1024
# Uploads are written in pieces of at least this size, so a small file is one write()
# (one inotify WRITE event, as the SDK's watch tests expect).
WRITE_BUFFER = 64 * 1024
# Cap on the output produced from one compressed input chunk (gzip bombs stay bounded).
INFLATE_STEP = 1024 * 1024
MAX_METADATA_BYTES = 4096
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _no_space(e: OSError) -> bool:
    return e.errno in _NO_SPACE


def authorize(state: SandboxState, req: Request, operation: str) -> None:
    """X-Access-Token if present, else a valid signature; anything goes without a token."""
    token = state.access_token
    if not token:
        return
    presented = req.headers.get("x-access-token")
    if presented:
        if not state.token_matches(presented):
            raise HTTPError(401, "access token present in header but does not match")
        return
    reason = signing.check_signature(
        path=req.query.get("path", ""),
        operation=operation,
        username=req.query.get("username"),
        token=token,
        presented=req.query.get("signature"),
        expiration=req.query.get("signature_expiration"),
    )
    if reason:
        raise HTTPError(401, reason)


def _user(state: SandboxState, req: Request) -> User:
    name = req.query.get("username") or None
    try:
        return state.user(name)
    except UnknownUserError as e:
        raise HTTPError(401, f"error looking up user '{name}': {e}") from None


def _resolve(path: str, user: User, state: SandboxState) -> str:
    try:
        return expand_and_resolve(path, user, state.default_workdir)
    except InvalidPathError as e:
        raise HTTPError(400, f"error resolving path: {e}") from None


def _content_disposition(name: str) -> bytes:
    if name.isascii() and '"' not in name and "\\" not in name:
        return f'inline; filename="{name}"'.encode()
    return f"inline; filename*=UTF-8''{quote(name, safe='')}".encode()


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """A single ``bytes=a-b`` range as [start, end); None to serve the whole file.

    Raises HTTPError(416) for an unsatisfiable range.
    """
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, sep, last = spec.strip().partition("-")
    if not sep:
        return None
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                raise HTTPError(416, "invalid range")
            return max(size - n, 0), size
        start = int(first)
        end = size if last == "" else min(int(last) + 1, size)
    except ValueError:
        return None
    if start >= size or start >= end:
        raise HTTPError(416, "range not satisfiable")
    return start, end


def _wants_gzip(accept: str) -> bool:
    """Compress only when gzip is the sole encoding offered (the SDK's ``gzip=True``):
    httpx offers ``gzip, deflate`` on every read, and compressing under TCG costs more
    than it saves on a local link."""
    offered = [p.split(";")[0].strip().lower() for p in accept.split(",") if p.strip()]
    return offered == ["gzip"]


def _range_chunks(fd: int, start: int, end: int) -> Iterator[bytes]:
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(READ_CHUNK, end - pos), pos)
        if not chunk:
            return  # truncated meanwhile
        pos += len(chunk)
        yield chunk


async def _send_body(send: Send, chunks: Iterator[bytes], gzip: bool) -> None:
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31) if gzip else None
    for chunk in chunks:
        if compressor is not None:
            chunk = compressor.compress(chunk)
            if not chunk:
                continue
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    tail = compressor.flush() if compressor is not None else b""
    await send({"type": "http.response.body", "body": tail, "more_body": False})


class FilesEndpoint:
    """The /files handlers (one instance per agent)."""

    def __init__(self, state: SandboxState, watchers: WatcherRegistry) -> None:
        self.state = state
        self.watchers = watchers

    # --- download ---------------------------------------------------------------------------

    async def get(self, req: Request, send: Send) -> None:
        authorize(self.state, req, signing.READ)
        user = _user(self.state, req)
        path = _resolve(req.query.get("path", ""), user, self.state)
        try:
            # O_NONBLOCK: opening a FIFO must not block the event loop (it is refused below).
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise HTTPError(404, f"path '{path}' does not exist") from None
        except IsADirectoryError:
            raise HTTPError(400, f"path '{path}' is a directory") from None
        except PermissionError as e:
            raise HTTPError(403, f"error opening file '{path}': {e}") from None
        except OSError as e:
            raise HTTPError(500, f"error opening file '{path}': {e}") from None
        try:
            info = os.fstat(fd)
            if st.S_ISDIR(info.st_mode):
                raise HTTPError(400, f"path '{path}' is a directory")
            if not st.S_ISREG(info.st_mode):
                raise HTTPError(400, f"path '{path}' is not a regular file")
            await self._stream_file(req, send, fd, path, info.st_size)
        finally:
            os.close(fd)

    async def _stream_file(self, req: Request, send: Send, fd: int, path: str, size: int) -> None:
        headers = [
            (b"content-type", b"application/octet-stream"),
            (b"content-disposition", _content_disposition(posixpath.basename(path))),
            (b"accept-ranges", b"bytes"),
            (b"vary", b"Accept-Encoding"),
        ]
        if size == 0:
            # Empty, or a pseudo-file that reports 0 bytes (/proc, /sys): read to EOF.
            return await self._stream_to_eof(req, send, fd, headers)
        status, start, end = 200, 0, size
        range_header = req.headers.get("range")
        if range_header:
            rng = _parse_range(range_header, size)
            if rng is not None:
                start, end = rng
                status = 206
                headers.append((b"content-range", f"bytes {start}-{end - 1}/{size}".encode()))
        gzip = status == 200 and _wants_gzip(req.headers.get("accept-encoding", ""))
        if gzip:
            headers.append((b"content-encoding", b"gzip"))
        else:
            headers.append((b"content-length", str(end - start).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await _send_body(send, _range_chunks(fd, start, end), gzip)

    async def _stream_to_eof(self, req: Request, send: Send, fd: int,
                             headers: list[tuple[bytes, bytes]]) -> None:  # fmt: skip
        """A file of unknown size: no ranges, no content-length (chunked)."""
        gzip = _wants_gzip(req.headers.get("accept-encoding", ""))
        if gzip:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await _send_body(send, iter(lambda: os.read(fd, READ_CHUNK), b""), gzip)

    # --- upload -----------------------------------------------------------------------------

    async def post(self, req: Request, send: Send) -> None:
        authorize(self.state, req, signing.WRITE)
        user = _user(self.state, req)
        metadata = _metadata(req.headers)
        encoding = req.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity", "gzip"):
            raise HTTPError(400, f"unsupported content encoding: {encoding}")
        content_type = req.headers.get("content-type", "")
        media = content_type.split(";")[0].strip().lower()
        try:
            if media == "application/octet-stream":
                written = await self._upload_raw(req, user, metadata, encoding == "gzip")
            elif media.startswith("multipart/"):
                written = await self._upload_multipart(
                    req, user, metadata, encoding == "gzip", content_type
                )
            else:
                raise HTTPError(
                    400,
                    f"unsupported content type: {content_type}, "
                    "expected multipart/form-data or application/octet-stream",
                )
        finally:
            self.watchers.drain_all()
        result = []
        for path in written:
            item: dict[str, object] = {
                "name": posixpath.basename(path),
                "type": "file",
                "path": path,
            }
            if metadata:
                item["metadata"] = metadata
            result.append(item)
        await send_json(send, 200, result)

    async def _body(self, req: Request, gzip: bool):  # type: ignore[no-untyped-def]
        """The request body, gunzipped on the fly if needed, in bounded pieces."""
        if not gzip:
            async for chunk in req.body_chunks():
                yield chunk
            return
        inflater = zlib.decompressobj(31)
        try:
            async for chunk in req.body_chunks():
                data = chunk
                while data:
                    out = inflater.decompress(data, INFLATE_STEP)
                    if out:
                        yield out
                    data = inflater.unconsumed_tail
            out = inflater.flush()
        except zlib.error as e:
            raise HTTPError(400, f"error decompressing request body: {e}") from None
        if out:
            yield out

    async def _upload_raw(
        self, req: Request, user: User, metadata: dict[str, str], gzip: bool
    ) -> list[str]:
        raw_path = req.query.get("path")
        if raw_path is None:
            raise HTTPError(400, "path query parameter is required for raw body upload")
        path = _resolve(raw_path, user, self.state)
        with _Upload(path, user, metadata) as up:
            async for chunk in self._body(req, gzip):
                up.write(chunk)
        return [path]

    async def _upload_multipart(
        self, req: Request, user: User, metadata: dict[str, str], gzip: bool, content_type: str
    ) -> list[str]:
        try:
            parser = MultipartParser(boundary_of(content_type))
        except MultipartError as e:
            raise HTTPError(400, f"error parsing multipart form: {e}") from None
        written: list[str] = []
        current: _Upload | None = None
        skipping = False
        try:
            async for chunk in self._body(req, gzip):
                try:
                    events = parser.feed(chunk)
                except MultipartError as e:
                    raise HTTPError(400, f"error reading form: {e}") from None
                for event in events:
                    if isinstance(event, PartStart):
                        current = None
                        target = self._part_target(event, user, req.query.get("path"))
                        skipping = target is None or target in written
                        if not skipping:
                            assert target is not None
                            current = _Upload(target, user, metadata).__enter__()
                            written.append(target)
                    elif event is PART_END:
                        if current is not None:
                            current.__exit__(None, None, None)
                            current = None
                    elif current is not None and not skipping:
                        current.write(event)  # type: ignore[arg-type]
        except BaseException as e:
            if current is not None:
                current.__exit__(type(e), e, None)
            raise
        if not parser.done:
            raise HTTPError(400, "error reading form: unexpected end of multipart body")
        if not written:
            raise HTTPError(400, "no file in the multipart form")
        return written

    def _part_target(self, part: PartStart, user: User, query_path: str | None) -> str | None:
        """Absolute target of a ``file`` part (``?path`` wins over the part's filename)."""
        _kind, params = parse_header_params(part.headers.get("content-disposition", ""))
        if params.get("name") != "file":
            return None
        path = query_path if query_path is not None else params.get("filename")
        if not path:
            raise HTTPError(400, "error getting multipart part file name")
        return _resolve(path, user, self.state)


def _metadata(headers: dict[str, str]) -> dict[str, str]:
    """``X-Metadata-<key>: <value>`` headers → {key (lower-case): value}, validated."""
    out: dict[str, str] = {}
    total = 0
    for name, value in headers.items():
        if not name.startswith("x-metadata-"):
            continue
        key = name[len("x-metadata-") :]
        if not key or not all(0x20 <= ord(c) <= 0x7E for c in key + value):
            raise HTTPError(400, f"invalid metadata header '{name}'")
        if len(METADATA_XATTR_PREFIX) + len(key) > 255:
            raise HTTPError(400, f"metadata key '{key}' is too long")
        total += len(METADATA_XATTR_PREFIX) + len(key) + len(value)
        out[key] = value
    if total > MAX_METADATA_BYTES:
        raise HTTPError(400, f"total metadata size {total} exceeds {MAX_METADATA_BYTES} bytes")
    return out


class _Upload:
    """One file being written: create (as envd: O_CREAT, chown, then data), buffer, close.

    A new file yields exactly the inotify events CREATE, ATTRIB (chown and xattrs, merged)
    and one MODIFY per write() (one for anything up to WRITE_BUFFER bytes).
    """

    def __init__(self, path: str, user: User, metadata: dict[str, str]) -> None:
        self.path = path
        self.user = user
        self.metadata = metadata
        self.fd = -1
        self.created = False
        self._buf = bytearray()

    def __enter__(self) -> _Upload:
        path, user = self.path, self.user
        try:
            ensure_dirs(posixpath.dirname(path), user)
        except NotADirectoryError as e:
            raise HTTPError(400, f"error ensuring directories: {e}") from None
        except OSError as e:
            raise self._error("error ensuring directories", e) from None
        existed = False
        try:
            info = os.stat(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise self._error("error getting file info", e) from None
        else:
            if st.S_ISDIR(info.st_mode):
                raise HTTPError(400, f"path is a directory: {path}")
            if not st.S_ISREG(info.st_mode):
                raise HTTPError(400, f"path is not a regular file: {path}")
            existed = True
            chown(path, user)
        try:
            # O_NONBLOCK: a FIFO that appeared meanwhile fails (ENXIO) instead of blocking.
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK
            self.fd = os.open(path, flags, 0o666)
        except IsADirectoryError:
            raise HTTPError(400, f"path is a directory: {path}") from None
        except OSError as e:
            raise self._error("error opening file", e) from None
        self.created = not existed
        if not existed:
            chown(self.fd, user)
        self._write_metadata()
        return self

    def _write_metadata(self) -> None:
        try:
            existing = os.listxattr(self.fd)
        except OSError:
            existing = []
        for name in existing:
            if name.startswith(METADATA_XATTR_PREFIX) and (
                name[len(METADATA_XATTR_PREFIX) :] not in self.metadata
            ):
                with contextlib.suppress(OSError):
                    os.removexattr(self.fd, name)
        for key, value in self.metadata.items():
            try:
                os.setxattr(self.fd, METADATA_XATTR_PREFIX + key, value.encode())
            except OSError as e:
                if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                    continue
                raise self._error("error writing metadata", e) from None

    def _error(self, what: str, e: OSError) -> HTTPError:
        if _no_space(e):
            return HTTPError(507, f"not enough disk space available: {what}: {e}")
        return HTTPError(500, f"{what} '{self.path}': {e}")

    def write(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) >= WRITE_BUFFER:
            self._flush()

    def _flush(self) -> None:
        view = memoryview(self._buf)
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
        except OSError as e:
            raise self._error("error writing file", e) from None
        finally:
            view.release()
        self._buf.clear()

    def __exit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        if self.fd < 0:
            return
        failed = exc_type is not None
        try:
            if not failed and self._buf:
                try:
                    self._flush()
                except BaseException:
                    failed = True
                    raise
        finally:
            if failed:
                self._discard()
            os.close(self.fd)
            self.fd = -1

    def _discard(self) -> None:
        """A failed upload (full disk, client gone) leaves no half-written file behind, nor
        the space it took. O_TRUNC already dropped an existing file's old content."""
        with contextlib.suppress(OSError):
            if self.created:
                os.unlink(self.path)
            else:
                os.ftruncate(self.fd, 0)
