"""Bounded diagnostic text from output: lines as they come, and a rolling
tail. Neither keeps a transcript or touches the process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Union, overload

from ._errors import SandkilnError, error
from ._http import check_timeout
from ._types import ByteChunk, StreamName, TextChunk


@dataclass(frozen=True, slots=True)
class ProcessLine:
    """One line of output, without its newline (LF or CRLF)."""

    stream: StreamName
    text: str
    partial: bool = False
    """The output ended (or the window does, or a gap cut it) without a newline after it."""
    truncated: bool = False
    """The line was longer than max_line_bytes: clipped, the rest discarded to its newline."""


@dataclass(frozen=True, slots=True)
class TailSnapshot:
    lines: list[ProcessLine]
    truncated: bool
    """Older output was discarded: the window may begin inside a line or a character."""


Piece = Union[TextChunk, ByteChunk, bytes]
"""A chunk of a process's output, or a terminal's bytes."""


def _bound(name: str, v: int | None, default: int) -> int:
    n = default if v is None else v
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise error("INVALID_ARGUMENT", f"{name} {n!r}: want a positive integer")
    return n


def _bytes_of(c: Any) -> bytes:
    if isinstance(c, (bytes, bytearray, memoryview)):
        return bytes(c)
    if isinstance(c, ByteChunk):
        return c.bytes
    if isinstance(c, TextChunk):
        return c.text.encode()
    raise error("INVALID_ARGUMENT", f"not a chunk of output: {type(c).__name__}")


def _stream_of(c: Any) -> StreamName:
    return "terminal" if isinstance(c, (bytes, bytearray, memoryview)) else c.stream


def _lost_of(c: Any) -> int:
    return 0 if isinstance(c, (bytes, bytearray, memoryview)) else int(c.lost)


class _Splitter:
    """Splits one stream's bytes into lines, each clipped at max bytes."""

    def __init__(self, stream: StreamName, limit: int) -> None:
        self._stream = stream
        self._max = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._clipped = False

    def push(self, b: bytes, out: list[ProcessLine]) -> None:
        """The lines b completes."""
        start = 0
        while True:
            nl = b.find(b"\n", start)
            self._take(b[start:] if nl < 0 else b[start:nl])
            if nl < 0:
                return
            out.append(self._line(False))
            start = nl + 1

    def end(self, out: list[ProcessLine]) -> None:
        """What is left, a partial line, if anything."""
        if self._size > 0 or self._clipped:
            out.append(self._line(True))

    def _take(self, piece: bytes) -> None:
        room = self._max + 1 - self._size  # one more, for a CR before the newline
        if len(piece) > room:
            self._clipped = True
        kept = piece[:max(0, room)]
        if kept:
            self._parts.append(kept)
            self._size += len(kept)

    def _line(self, partial: bool) -> ProcessLine:
        b = b"".join(self._parts)
        if not partial and b.endswith(b"\r"):
            b = b[:-1]
        truncated = self._clipped
        if len(b) > self._max:
            b = b[:_cut_at(b, self._max)]
            truncated = True
        self._parts = []
        self._size = 0
        self._clipped = False
        return ProcessLine(self._stream, b.decode("utf-8", "replace"), partial, truncated)


def _cut_at(b: bytes, limit: int) -> int:
    """The longest prefix of at most limit bytes that ends on a character's boundary."""
    n = limit
    while 0 < n < len(b) and (b[n] & 0xC0) == 0x80:
        n -= 1
    return n


class _Lines:
    """The splitting that both shapes of read_process_lines share."""

    def __init__(self, limit: int) -> None:
        self._max = limit
        self._splitters: dict[StreamName, _Splitter] = {}

    def take(self, c: Any) -> list[ProcessLine]:
        stream = _stream_of(c)
        s = self._splitters.get(stream)
        if s is None:
            s = self._splitters[stream] = _Splitter(stream, self._max)
        out: list[ProcessLine] = []
        if _lost_of(c) > 0:
            s.end(out)  # the line a gap cuts ends there
        else:
            s.push(_bytes_of(c), out)
        return out

    def end(self) -> list[ProcessLine]:
        out: list[ProcessLine] = []
        for s in self._splitters.values():
            s.end(out)
        return out


@overload
def read_process_lines(output: AsyncIterable[Piece], *, max_line_bytes: int = 16_384,
                       timeout: float | None = None) -> AsyncIterator[ProcessLine]: ...


@overload
def read_process_lines(output: Iterable[Piece], *, max_line_bytes: int = 16_384,
                       timeout: float | None = None) -> Iterator[ProcessLine]: ...


def read_process_lines(output: AsyncIterable[Piece] | Iterable[Piece], *, max_line_bytes: int = 16_384,
                       timeout: float | None = None) -> AsyncIterator[ProcessLine] | Iterator[ProcessLine]:
    """Lines of a process's output (its chunks, or a terminal's bytes), per
    stream, as they complete: UTF-8 split across chunks and CRLF handled,
    lines longer than max_line_bytes clipped and marked truncated, a last
    line without a newline marked partial, as is a line a gap cuts
    (overflow "report"). Given an async iterable (an AsyncProcessHandle's
    output()), it is an async iterator; given an iterable (a ProcessHandle's
    output()), an iterator. timeout bounds the whole reading (WAIT_ABORTED),
    as does cancelling it: it stops reading at once, whatever the iterable,
    and in stream mode releases only output observation."""
    limit = _bound("max_line_bytes", max_line_bytes, 16_384)
    check_timeout(timeout, "read_process_lines()")
    lines = getattr(output, "_lines", None)
    if callable(lines):
        # The synchronous client's output: split on its event loop.
        it: Iterator[ProcessLine] | None = lines(limit, timeout)
        if it is not None:
            return it
    if isinstance(output, AsyncIterable):
        return _async_lines(output, _Lines(limit), timeout)
    if isinstance(output, Iterable):
        return _sync_lines(output, _Lines(limit), timeout)
    raise error("INVALID_ARGUMENT", "read_process_lines(): output must be iterable, such as a handle's output()")


async def _async_lines(output: AsyncIterable[Piece], lines: _Lines, timeout: float | None) -> AsyncIterator[ProcessLine]:
    it = output.__aiter__()
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    try:
        while True:
            # wait_for cancels a pending next() at the deadline: a quiet
            # iterable of the caller's own stops too.
            left = None if deadline is None else deadline - asyncio.get_running_loop().time()
            try:
                if left is None:
                    c = await it.__anext__()
                elif left <= 0:
                    raise TimeoutError
                else:
                    c = await asyncio.wait_for(it.__anext__(), left)
            except StopAsyncIteration:
                break
            except TimeoutError as err:
                # The iterable's own timeout (an output()'s) is its to report.
                if isinstance(err, SandkilnError) or deadline is None or asyncio.get_running_loop().time() < deadline:
                    raise
                raise error("WAIT_ABORTED", f"read_process_lines(): timed out after {timeout} s") from err
            for line in lines.take(c):
                yield line
        for line in lines.end():
            yield line
    finally:
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()


def _sync_lines(output: Iterable[Piece], lines: _Lines, timeout: float | None) -> Iterator[ProcessLine]:
    # An arbitrary iterable cannot be interrupted while it blocks: the
    # deadline is checked between its items.
    deadline = None if timeout is None else time.monotonic() + timeout
    it = iter(output)
    try:
        for c in it:
            if deadline is not None and time.monotonic() > deadline:
                raise error("WAIT_ABORTED", f"read_process_lines(): timed out after {timeout} s")
            yield from lines.take(c)
        yield from lines.end()
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


class ProcessTail:
    """A rolling window of recent output, for diagnostics: push() each chunk
    (or a terminal's bytes) while saving it to your own log; snapshot()
    gives the window as lines at once, each snapshot independent."""

    def __init__(self, *, max_bytes: int = 65_536, max_chunks: int = 256, max_lines: int = 200, max_line_bytes: int = 16_384) -> None:
        self._max_bytes = _bound("max_bytes", max_bytes, 65_536)
        self._max_chunks = _bound("max_chunks", max_chunks, 256)
        self._max_lines = _bound("max_lines", max_lines, 200)
        self._max_line_bytes = _bound("max_line_bytes", max_line_bytes, 16_384)
        self._window: list[tuple[StreamName, bytes]] = []
        self._size = 0
        self._truncated = False

    def push(self, chunk: Piece) -> None:
        if _lost_of(chunk) > 0:
            self._truncated = True
            return
        b = _bytes_of(chunk)
        if not b:
            return
        if len(b) > self._max_bytes:
            b = b[len(b) - self._max_bytes:]
            self._truncated = True
        self._window.append((_stream_of(chunk), b))
        self._size += len(b)
        while len(self._window) > self._max_chunks or self._size > self._max_bytes:
            stream, first = self._window[0]
            self._truncated = True
            if len(self._window) > self._max_chunks or self._size - len(first) >= self._max_bytes:
                self._window.pop(0)
                self._size -= len(first)
            else:
                cut = self._size - self._max_bytes
                self._window[0] = (stream, first[cut:])
                self._size -= cut

    def snapshot(self) -> TailSnapshot:
        lines = _Lines(self._max_line_bytes)
        out: list[ProcessLine] = []
        for stream, b in self._window:
            out.extend(lines.take(ByteChunk(stream, b, 0, 0)))
        out.extend(lines.end())
        # Lines past max_lines are discarded too, and the snapshot says so.
        return TailSnapshot(out[max(0, len(out) - self._max_lines):], self._truncated or len(out) > self._max_lines)
