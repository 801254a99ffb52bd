"""A sandbox's files: read and written whole or streamed, listed, made
and removed, and tar archives in and out."""

from __future__ import annotations

import asyncio
import builtins
import json
from collections.abc import Callable
from typing import cast

from ._errors import error
from ._http import Response, Transport, check_timeout, segment
from ._streams import AsyncByteStream, Source, body_of, left
from ._types import FileInfo


def _file_path(p: str) -> str:
    if not isinstance(p, str) or not p.startswith("/"):
        raise error("INVALID_ARGUMENT", f"path {p!r}: want an absolute path in the sandbox")
    return "/files/" + "/".join(segment(x) for x in p.split("/") if x)


class AsyncFiles:
    """A sandbox's files, read and written by its root, confined as its
    processes are. Bodies are streamed both ways: nothing is held whole
    unless read() asks for it."""

    def __init__(self, t: Transport, path: Callable[[str], str]) -> None:
        self._t = t
        self._path = path

    async def read(self, path: str, *, timeout: float | None = None) -> bytes:
        """A file's content, whole."""
        async with await self.read_stream(path, timeout=timeout) as body:
            return await body.read()

    async def read_text(self, path: str, *, timeout: float | None = None) -> str:
        """A file's content as UTF-8 text (invalid bytes as U+FFFD)."""
        return (await self.read(path, timeout=timeout)).decode("utf-8", "replace")

    async def read_stream(self, path: str, *, timeout: float | None = None) -> AsyncByteStream:
        """A file's content as it comes: ``async for chunk in stream``.
        timeout bounds the whole read; without one, nothing local does."""
        target = self._path(_file_path(path))
        loop = asyncio.get_running_loop()
        start = loop.time()
        resp = await self._t.fetch("GET", target, idempotent=True, unbounded=True, timeout=timeout)
        if (resp.headers.get("Content-Type") or "").startswith("application/json"):
            resp.close()
            raise error("INVALID_ARGUMENT", f"{path} is a directory: use files.list()")
        return AsyncByteStream(resp, f"read {path}", left(timeout, loop.time() - start))

    async def write(self, path: str, data: Source, *, mode: str | None = None, timeout: float | None = None) -> FileInfo:
        """Writes a file whole, all or nothing (its parent directories
        made): data as bytes, a str (UTF-8), a binary file read from where
        it stands, or an iterable of bytes, sent as it is read."""
        body, length = body_of(data, f"write {path}")
        check_timeout(timeout, "files.write()")
        return cast(FileInfo, await self._t.call(
            "PUT", self._path(_file_path(path)), body=body, length=length, query={"mode": mode},
            idempotent=True, unbounded=True, timeout=timeout))

    async def list(self, path: str, *, timeout: float | None = None) -> builtins.list[FileInfo]:
        """A directory's entries, by name."""
        # A directory's listing is JSON; a file's content is not read.
        resp = await self._t.fetch("GET", self._path(_file_path(path) + "/"), idempotent=True, timeout=timeout, read=_is_json)
        resp.close()
        got = json.loads(resp.body) if _is_json(resp) else None
        if not isinstance(got, list):
            raise error("INVALID_ARGUMENT", f"{path} is not a directory")
        return cast("builtins.list[FileInfo]", got)

    async def stat(self, path: str, *, timeout: float | None = None) -> FileInfo:
        """What the path is (a final link not followed)."""
        return cast(FileInfo, await self._t.call("GET", self._path(_file_path(path)), query={"stat": True},
                                                           idempotent=True, timeout=timeout))

    async def remove(self, path: str, *, recursive: bool = False, timeout: float | None = None) -> None:
        """Removes a file or an empty directory; with recursive, a directory
        and all in it."""
        await self._t.call("DELETE", self._path(_file_path(path)), query={"recursive": True if recursive else None},
                                     idempotent=True, timeout=timeout)

    async def mkdir(self, path: str, *, timeout: float | None = None) -> FileInfo:
        """Makes a directory and its parents."""
        return cast(FileInfo, await self._t.call("POST", self._path(_file_path(path)), query={"op": "mkdir"},
                                                           idempotent=True, timeout=timeout))

    async def move(self, src: str, dst: str, *, timeout: float | None = None) -> FileInfo:
        """Renames src to the absolute path dst in one step, as rename(2) in
        the sandbox does (an existing file there is replaced), and says
        what it is then."""
        _file_path(dst)
        return cast(FileInfo, await self._t.call("POST", self._path(_file_path(src)), query={"op": "move", "to": dst},
                                                           timeout=timeout))

    async def archive(self, path: str, *, timeout: float | None = None) -> AsyncByteStream:
        """A tar of path (a directory with all in it, or one file), its
        entries named from the path's base name, as docker cp gives it,
        streamed as it is read; the stream's info is what the path is."""
        _file_path(path)
        loop = asyncio.get_running_loop()
        start = loop.time()
        resp = await self._t.fetch("GET", self._path("/archive"), query={"path": path}, idempotent=True,
                                             unbounded=True, timeout=timeout)
        try:
            info = json.loads(resp.headers.get("Kiln-Path-Stat") or "")
        except ValueError as err:
            resp.close()
            raise error("INTERNAL", f"archive {path}: kilnd's answer has no Kiln-Path-Stat") from err
        return AsyncByteStream(resp, f"archive {path}", left(timeout, loop.time() - start), info)

    async def extract(self, dir: str, tar: Source, *, timeout: float | None = None) -> FileInfo:
        """Extracts a tar into the directory dir, which must exist, all or
        nothing, and says what dir is then. Its entries belong to the
        sandbox's root, permissions and times kept (setuid and setgid
        dropped); absolute names, "..", device nodes and links leading out
        of dir are refused (PERMISSION_DENIED). The tar is sent as it is read."""
        _file_path(dir)
        body, length = body_of(tar, f"extract into {dir}")
        check_timeout(timeout, "files.extract()")
        return cast(FileInfo, await self._t.call(
            "PUT", self._path("/archive"), query={"path": dir}, body=body, length=length,
            content_type="application/x-tar", idempotent=True, unbounded=True, timeout=timeout))


def _is_json(resp: Response) -> bool:
    return (resp.headers.get("Content-Type") or "").startswith("application/json")
