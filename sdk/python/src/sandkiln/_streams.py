"""Bodies in and out, streamed: what a caller sends (bytes, a file, an
iterable) read as it goes, and what kilnd answers (a file, a tar, a log, a
port's answer) read as it comes, never held whole unless asked for."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import stat as statmod
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import IO, Any, Union, cast

from ._errors import SandkilnError, error
from ._http import Headers, Response

Source = Union[bytes, bytearray, memoryview, str, IO[bytes], Iterable[bytes], AsyncIterable[bytes]]
"""A body to send: bytes (a str as UTF-8), a binary file (read from where it
stands), or an iterable of bytes, synchronous or asynchronous, each read as
it is sent."""

_READ = 1 << 20
_MAX_LINE = 4 << 20


def body_of(source: Source, what: str) -> tuple[bytes | AsyncIterable[bytes], int | None]:
    """source as a request body, and its length when it is known (a file's
    size is, an iterable's is not). Reads of a file or a synchronous
    iterable run in a worker thread, so that a slow one never holds up the
    event loop."""
    if isinstance(source, str):
        return source.encode(), None
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), None
    if hasattr(source, "read"):
        f: IO[bytes] = source  # type: ignore[assignment]
        return _file_chunks(f), _file_left(f)
    if isinstance(source, AsyncIterable):
        return _checked(source, what), None
    if isinstance(source, Iterable):
        return _iter_chunks(iter(cast("Iterable[bytes]", source)), what), None
    raise error("INVALID_ARGUMENT", f"{what}: a body must be bytes, str, a binary file or an iterable of bytes, not {type(source).__name__}")


def _file_left(f: IO[bytes]) -> int | None:
    """What a regular file has left from where it stands; None for a pipe."""
    try:
        st = os.fstat(f.fileno())
        if not statmod.S_ISREG(st.st_mode):
            return None
        return max(0, st.st_size - f.tell())
    except (AttributeError, OSError, ValueError):
        return None


async def _file_chunks(f: IO[bytes]) -> AsyncIterator[bytes]:
    while True:
        b = await asyncio.to_thread(f.read, _READ)
        if not b:
            return
        if isinstance(b, str):
            raise error("INVALID_ARGUMENT", "a body's file must be opened in binary mode")
        yield b


_END = object()


async def _iter_chunks(it: Iterator[bytes], what: str) -> AsyncIterator[bytes]:
    def pull() -> object:
        return next(it, _END)

    while True:
        b = await asyncio.to_thread(pull)
        if b is _END:
            return
        yield _bytes(b, what)


async def _checked(source: AsyncIterable[bytes], what: str) -> AsyncIterator[bytes]:
    async for b in source:
        yield _bytes(b, what)


def _bytes(b: object, what: str) -> bytes:
    if isinstance(b, (bytes, bytearray, memoryview)):
        return bytes(b)
    raise error("INVALID_ARGUMENT", f"{what}: an iterable body must give bytes, not {type(b).__name__}")


class AsyncByteStream:
    """An answer's body as it comes: ``async for chunk in stream``, or
    read(). Close it (``async with``, aclose()) if it is not read to its end.
    timeout, when given, bounds the whole read (WAIT_ABORTED); a body that
    breaks off is UNAVAILABLE."""

    def __init__(self, resp: Response, what: str, timeout: float | None, info: Any = None) -> None:
        self.status = resp.status
        """The HTTP status (a port's answer has its app's)."""
        self.headers = resp.headers
        self.info = info
        """What was archived (files.archive()), or None."""
        self._resp = resp
        self._what = what
        self._timeout = timeout
        self._deadline: float | None = None
        if timeout is not None:
            self._deadline = asyncio.get_running_loop().time() + timeout

    @property
    def trailers(self) -> Headers:
        """The answer's trailer fields, once its body was read to its end."""
        return self._resp.trailers

    @property
    def done(self) -> bool:
        return self._resp.done

    def __aiter__(self) -> AsyncByteStream:
        return self

    async def __anext__(self) -> bytes:
        b = await self.read_some()
        if not b:
            raise StopAsyncIteration
        return b

    async def read_some(self, limit: int = _READ) -> bytes:
        """The next bytes as they come, at most limit; b"" at the end."""
        scope = asyncio.timeout_at(self._deadline)
        try:
            async with scope:
                return await self._resp.read_some(limit)
        except TimeoutError as err:
            if not scope.expired():
                raise
            self._resp.close()
            raise error("WAIT_ABORTED", f"{self._what}: timed out after {self._timeout} s") from err

    async def read(self) -> bytes:
        """The rest of the body, whole."""
        parts: list[bytes] = []
        async for b in self:
            parts.append(b)
        return b"".join(parts)

    async def aclose(self) -> None:
        self._resp.close()

    def close_now(self) -> None:
        self._resp.close()

    async def __aenter__(self) -> AsyncByteStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._resp.close()


async def ndjson(stream: AsyncByteStream, what: str) -> AsyncIterator[Any]:
    """Each line of a body parsed as JSON; a line that is not JSON, or one
    too long, fails it as INTERNAL."""
    buf = b""
    try:
        async for b in stream:
            buf += b
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                line, buf = buf[:nl], buf[nl + 1:]
                if line.strip():
                    yield _parse(line, what)
            if len(buf) > _MAX_LINE:
                raise error("INTERNAL", f"{what}: a line of the answer is over {_MAX_LINE} bytes")
        if buf.strip():
            yield _parse(buf, what)
    finally:
        stream.close_now()


def _parse(line: bytes, what: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as err:
        raise error("INTERNAL", f"{what}: a line of the answer is not JSON") from err


def progress_error(p: Any, what: str) -> SandkilnError:
    """The error an NDJSON progress line of status "error" carries."""
    from ._errors import from_answer

    return from_answer(200, {"error": p.get("error")}, what)


def left(timeout: float | None, spent: float) -> float | None:
    """What is left of a timeout once spent seconds went (a little, never
    none: the time ran out at the next wait, not before)."""
    return None if timeout is None else max(timeout - spent, 1e-6)


async def maybe_await(v: object) -> None:
    """Awaits what a callback gave back, if it is awaitable."""
    if inspect.isawaitable(v):
        await v
