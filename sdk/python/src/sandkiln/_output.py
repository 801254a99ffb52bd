"""A handle's output: what its connection's messages become (chunks in a
bounded queue, text decoded per stream, gaps counted exactly), and the
iterator its one consumer reads them with, granting kilnd credit as it
goes."""

from __future__ import annotations

import asyncio
import json
import struct
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, Union, cast

from ._errors import SandkilnError, error
from ._http import check_timeout
from ._types import LIMITS, ByteChunk, StreamName, TextChunk, exit_of
from ._utf8 import StreamDecoder

if TYPE_CHECKING:
    from ._process import AsyncHandle

C = TypeVar("C", bound=Union[TextChunk, ByteChunk])

# What a frame costs of the credit at least (the protocol's rule: its
# payload or this, whichever is more), so that the unread queue's bound in
# credit bounds its chunks as well as its bytes: 64 KiB / 256 = 256 bytes.
CREDIT_FRAME = LIMITS.max_queued_bytes // LIMITS.max_queued_chunks

# The credit an output connection grants kilnd: the unread queue's bound,
# and as much again on its way, held apart until the consumer makes room (a
# transport may take bounded frames before the queue is checked; here at
# most a queue's worth). The second half keeps a reader that keeps up from
# waiting a round trip for credit at every queue's worth.
WINDOW = 2 * LIMITS.max_queued_bytes

# Credit goes back to kilnd once this much was read: half the window, so
# that half is on its way while the other is read, in few messages (each a
# write that wakes kilnd; at a quarter of the queue, they halved a burst's
# pace). kilnd always has credit for a frame while the queue is empty:
# WINDOW less this exceeds a frame.
GRANT_EVERY = WINDOW // 2

FRAME_HEADER = 17
_STREAMS: dict[int, StreamName] = {1: "stdout", 2: "stderr", 3: "terminal"}

class _Pending:
    """A chunk on its way to the consumer, and where its stream stands once
    it is delivered."""

    __slots__ = ("stream", "offset", "seq", "text", "parts", "lost", "next", "end", "silent", "size", "cost", "sealed")

    def __init__(self, stream: StreamName, offset: int, seq: int, text: str, data: bytes,
                 next_: int, lost: int, end: bool, cost: int, text_mode: bool) -> None:
        self.stream = stream
        self.offset = offset
        self.seq = seq
        self.text = text
        self.parts: list[bytes] = [] if lost > 0 or end or not data or text_mode else [data]
        self.lost = lost
        # Where the stream stands once this is delivered (bytes of a
        # character the decoder holds back excluded).
        self.next = next_
        self.end = end
        # Nothing to show: only the position or the end to record.
        self.silent = lost == 0 and (text == "" if text_mode else (len(data) == 0 or end))
        self.size = 0 if lost > 0 else len(data)
        # What its frame cost of the credit (the first piece of a frame
        # carries the frame's whole cost beyond its bytes).
        self.cost = cost
        # Shown to a consumer before it was delivered (the synchronous
        # iterator's batch): it no longer grows.
        self.sealed = False

    def chunk(self, text_mode: bool) -> TextChunk | ByteChunk:
        if text_mode:
            return TextChunk(self.stream, self.text, self.offset, self.seq, self.lost)
        data = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        return ByteChunk(self.stream, data, self.offset, self.seq, self.lost)


@dataclass
class _Chunk:
    p: _Pending


@dataclass
class _End:
    """The exit came: the output is whole."""


@dataclass
class _Closed:
    code: int
    reason: str


@dataclass
class _Failed:
    err: SandkilnError


_Item = Union[_Chunk, _End, _Closed, _Failed]


class _Queue:
    """The items of one output connection, in order, for the one consumer:
    the unread queue within its bounds (64 KiB of credit, so 256 chunks at
    most), and behind it what arrived past them, held apart until the
    consumer makes room. Only the loop touches it."""

    def __init__(self) -> None:
        self.items: deque[_Item] = deque()
        self.arriving: deque[_Item] = deque()
        # The connection was let go: its later messages are not queued.
        self.stopped = False
        self.chunks = 0
        self.cost = 0  # the credit the queued chunks' frames cost
        self.held = 0  # the credit of what arrived past the queue's bounds
        self._ready = asyncio.Event()

    def push(self, it: _Item) -> None:
        if self.arriving or (isinstance(it, _Chunk) and self.cost + it.p.cost > LIMITS.max_queued_bytes):
            self.arriving.append(it)
            if isinstance(it, _Chunk):
                self.held += it.p.cost
            return
        self._enqueue(it)

    def _enqueue(self, it: _Item) -> None:
        if isinstance(it, _Chunk):
            self.cost += it.p.cost
            if self._merge(it.p):
                return
            self.chunks += 1
        self.items.append(it)
        self._ready.set()

    def _merge(self, p: _Pending) -> bool:
        """Joins p to the last chunk queued when it continues it (the same
        stream, its next bytes, output both) and both fit in one chunk:
        fewer, larger chunks for a reader that is behind. Only the last
        chunk grows, and the consumer has not seen it yet."""
        if not self.items or not isinstance(self.items[-1], _Chunk):
            return False
        a = self.items[-1].p
        if a.sealed or a.end or p.end or a.lost or p.lost or a.stream != p.stream:
            return False
        if a.offset + a.size != p.offset or a.size + p.size > LIMITS.max_chunk_bytes:
            return False
        a.text += p.text
        a.parts.extend(p.parts)
        a.size += p.size
        a.cost += p.cost
        a.next = p.next
        a.silent = a.silent and p.silent
        self._ready.set()
        return True

    def wake(self) -> None:
        self._ready.set()

    async def take(self, stop: Callable[[], bool]) -> _Item | None:
        """The next item, or None once stop() says so."""
        while True:
            if stop():
                return None
            if self.items:
                break
            self._ready.clear()
            await self._ready.wait()
        return self.pop()

    def peek(self, most: int) -> list[_Pending]:
        """The chunks at the queue's head, at most most of them, that are
        output to show as they are (no gap, end or error among them, nor
        behind them in the list), sealed: they stay queued until delivered."""
        out: list[_Pending] = []
        for it in self.items:
            if len(out) >= most or not isinstance(it, _Chunk) or it.p.silent or it.p.lost or it.p.end:
                break
            it.p.sealed = True
            out.append(it.p)
        return out

    def pop(self) -> _Item:
        """The item at the head, which there is."""
        it = self.items.popleft()
        if isinstance(it, _Chunk):
            self.cost -= it.p.cost
            self.chunks -= 1
        # What waited behind the queue's bounds comes in as room is made.
        while self.arriving:
            nxt = self.arriving[0]
            if isinstance(nxt, _Chunk) and self.cost + nxt.p.cost > LIMITS.max_queued_bytes:
                break
            self.arriving.popleft()
            if isinstance(nxt, _Chunk):
                self.held -= nxt.p.cost
            self._enqueue(nxt)
        return it

    def clear(self) -> None:
        self.items.clear()
        self.arriving.clear()
        self.chunks = self.cost = self.held = 0
        self._ready.set()


class _Incoming:
    """What one output connection's messages become: chunks in its queue,
    in pieces of at most 16 KiB, each stream's text decoded by a decoder of
    its own, gaps reported exactly, and where each stream will stand once
    what is queued is delivered. Only the connection's reader calls it."""

    def __init__(self, h: AsyncHandle[Any], q: _Queue) -> None:
        self._h = h
        self._q = q
        self._text = h._settings.format == "text"
        self._at: dict[str, int] = dict(h._offsets)
        self._decoders: dict[str, StreamDecoder] = {}
        s = h._settings
        # What finite mode may still deliver; -1 in stream mode.
        self._finite_left = s.max_output_bytes - h._delivered if s.mode == "finite" else -1

    def message(self, data: str | bytes) -> None:
        if isinstance(data, str):
            self._control(data)
        else:
            self._frame(data)

    def _decoder(self, name: str) -> StreamDecoder:
        d = self._decoders.get(name)
        if d is None:
            d = self._decoders[name] = StreamDecoder()
        return d

    def _pos(self, name: str) -> int:
        """Where the stream stands once the queue is delivered, bytes of a
        character the decoder holds back included."""
        return self._at.get(name, 0) + (self._decoder(name).held if self._text else 0)

    def _put(self, p: _Pending) -> None:
        self._at[p.stream] = max(self._at.get(p.stream, 0), p.next)
        self._q.push(_Chunk(p))

    def _gap(self, name: StreamName, start: int, to: int) -> None:
        # What the decoder held of a cut character goes first, then the gap.
        if self._text and self._decoder(name).held > 0:
            text = self._decoder(name).flush()
            self._put(_Pending(name, start, 0, text, b"", start, 0, False, 0, True))
        self._put(_Pending(name, to, 0, "", b"", to, to - start, False, 0, self._text))

    def _control(self, data: str) -> None:
        try:
            m = json.loads(data)
        except ValueError:
            return
        if not isinstance(m, dict):
            return
        kind, name = m.get("type"), m.get("stream")
        streams = self._h._streams
        if kind == "gap" and name in streams and isinstance(m.get("to"), int):
            self._gap(name, max(int(m.get("from") or 0), self._pos(name)), m["to"])
        elif kind == "end" and name in streams and isinstance(m.get("total_bytes"), int):
            total: int = m["total_bytes"]
            if total > self._pos(name):
                self._gap(name, self._pos(name), total)
            text = self._decoder(name).flush() if self._text else ""
            self._put(_Pending(name, total, 0, text, b"", total, 0, True, 0, self._text))
        elif kind == "exit":
            # Last, after every stream's end: the output is whole without
            # waiting for the close.
            self._h._exit = exit_of(m)
            self._q.push(_End())
            self._q.stopped = True

    def _frame(self, data: bytes) -> None:
        h, q = self._h, self._q
        if len(data) < FRAME_HEADER:
            return
        name = _STREAMS.get(data[0])
        if name is None:
            return
        offset, seq = struct.unpack_from("!QQ", data, 1)
        if offset > self._pos(name):
            # A jump kilnd did not explain is reported all the same.
            self._gap(name, self._pos(name), offset)
        payload = memoryview(data)[FRAME_HEADER:]
        cost = max(len(payload), CREDIT_FRAME)
        if self._finite_left >= 0:
            if len(payload) > self._finite_left:
                self._pieces(name, offset, seq, payload[:self._finite_left], cost)
                self._finite_left = 0
                h._stop(q, error("OUTPUT_CAPACITY", f"process {h.id}: finite output is at most {h._settings.max_output_bytes} "
                                 'bytes; start it with output={"mode": "stream"} for more'))
                return
            self._finite_left -= len(payload)
        self._pieces(name, offset, seq, payload, cost)
        if q.cost + q.held > WINDOW:
            # kilnd sends only what was granted: this is not kilnd speaking.
            h._stop(q, error("INTERNAL", f"process {h.id}: kilnd sent {q.cost + q.held} bytes of output with {WINDOW} granted"))

    def _pieces(self, name: StreamName, offset: int, seq: int, data: memoryview, cost: int) -> None:
        """Queues a frame's data in chunks of at most 16 KiB, each costing
        its length of the frame's credit, the first what the frame cost
        beyond its length too: no chunk costs more than the queue takes."""
        if len(data) == 0:
            held = self._decoder(name).held if self._text else 0
            self._put(_Pending(name, offset, seq, "", b"", offset - held, 0, False, cost, self._text))
            return
        step = LIMITS.max_chunk_bytes
        for i in range(0, len(data), step):
            piece = bytes(data[i:i + step])
            end = offset + i + len(piece)
            c = len(piece) + (cost - len(data) if i == 0 else 0)
            if self._text:
                d = self._decoder(name)
                text = d.decode(piece)
                self._put(_Pending(name, offset + i, seq + i, text, piece, end - d.held, 0, False, c, True))
            else:
                self._put(_Pending(name, offset + i, seq + i, "", piece, end, 0, False, c, False))


class AsyncOutput(AsyncIterator[C]):
    """A handle's output, replay then live, from where the handle stands
    (the beginning, or where a reopened handle's reference stood), until
    every stream ended: ``async for chunk in child.output()``.

    kilnd sends no more than the unread queue holds (64 KiB, 256 chunks)
    and more as the consumer reads: a consumer that keeps up gets every
    byte, and one that falls behind holds kilnd back, never the queue past
    its bound. A process this handle started holds its output for it (it
    waits for its reader); one it did not start may lose what kilnd cannot
    keep while the consumer is behind: then, by default (overflow "fail"),
    the output fails with OUTPUT_CAPACITY saying how many bytes; with
    "report", a chunk with lost set and no output says so, and the output
    goes on.

    If the connection breaks, it fails with UNAVAILABLE, and calling
    output() again resumes after the last chunk delivered, nothing repeated.
    Leaving the loop (break, an exception, aclose(), the end of an ``async
    with``) stops reading: in stream mode the process no longer waits for
    this handle, and input and control go on; in finite mode the handle is
    detached. timeout bounds the whole iteration (WAIT_ABORTED)."""

    def __init__(self, h: AsyncHandle[C], timeout: float | None) -> None:
        self._h: AsyncHandle[C] = h
        self._timeout = timeout
        self._deadline: float | None = None
        self._started = False
        self._over = False
        self._closing = False  # aclose() was called
        self._has_reading = False  # this iterator holds its handle's one consumer
        self._q: _Queue | None = None
        self._ungranted = 0
        self._whole = False  # the output came to its end
        self._broken = False  # the connection broke: a later output() resumes
        self._peeked: deque[_Pending] = deque()  # shown to the synchronous consumer, not yet taken
        self._busy = False  # a call of __anext__ is under way

    def __aiter__(self) -> AsyncOutput[C]:
        return self

    async def __aenter__(self) -> AsyncOutput[C]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def __anext__(self) -> C:
        if self._over:
            raise StopAsyncIteration
        if self._busy:
            raise error("OUTPUT_IN_USE", f"process {self._h.id}: this output is being read by another task already")
        self._busy = True
        try:
            return await self._step()
        finally:
            self._busy = False

    async def _step(self) -> C:
        h = self._h
        try:
            if not self._started:
                self._started = True
                check_timeout(self._timeout, "output()")
                if self._timeout is not None:
                    self._deadline = h._loop.time() + self._timeout
                if h._gone:
                    raise h._detached()
                if h._reading:
                    raise error("OUTPUT_IN_USE", f"process {h.id}: its output has a consumer already")
                h._reading = True
                self._has_reading = True
            scope = asyncio.timeout_at(self._deadline)
            try:
                async with scope:
                    if self._q is None:
                        self._q = await h._connect()
                    return await self._next(self._q)
            except TimeoutError as err:
                if not scope.expired():
                    raise
                raise error("WAIT_ABORTED", f"output(): timed out after {self._timeout} s") from err
        except StopAsyncIteration:
            self._finish()
            raise
        except BaseException as err:
            if isinstance(err, SandkilnError) and err.code == "UNAVAILABLE":
                self._broken = True
            self._finish()
            raise

    async def _next(self, q: _Queue) -> C:
        h = self._h
        text_mode = h._settings.format == "text"
        while True:
            it = await q.take(lambda: self._closing)
            if it is None:
                raise StopAsyncIteration
            if isinstance(it, _Failed):
                raise it.err
            if isinstance(it, _End):
                self._whole = True
                raise StopAsyncIteration
            if isinstance(it, _Closed):
                if h._gone:
                    raise h._detached()
                self._broken = True
                raise error("UNAVAILABLE", f"process {h.id}: output interrupted ({it.code}{' ' + it.reason if it.reason else ''}); "
                            "call output() again to resume")
            p = it.p
            self._delivered(p)
            if p.lost and h._settings.overflow == "fail":
                raise error("OUTPUT_CAPACITY", f"process {h.id}: {p.lost} bytes of {p.stream} were lost before this handle read them "
                            '(the reader fell behind what kilnd keeps); overflow "report" goes on past such gaps')
            if p.silent:
                continue
            return cast(C, p.chunk(text_mode))

    def _delivered(self, p: _Pending) -> None:
        self._h._deliver(p)
        self._ungranted += p.cost
        if self._ungranted >= GRANT_EVERY:
            self._h._grant(self._ungranted)
            self._ungranted = 0

    async def _batch(self, most: int) -> list[C]:
        """For the synchronous iterator, which reaches the loop from another
        thread: the next chunk, as __anext__ gives it, and behind it the
        chunks already queued (at most most in all). Those stay in the
        queue, sealed, until the consumer takes each (_settle), so that
        what is read but not yet taken is never more than the queue holds,
        and a consumer that stops early has not had them delivered."""
        first = await self.__anext__()
        if self._over or self._q is None:
            return [first]
        rest = self._q.peek(most - 1)
        self._peeked.extend(rest)
        text_mode = self._h._settings.format == "text"
        return [first, *(cast(C, p.chunk(text_mode)) for p in rest)]

    def _settle(self) -> None:
        """The synchronous consumer took the oldest chunk of its batch: it
        is delivered now (its offset counts, its credit goes back)."""
        if not self._peeked:
            return
        p = self._peeked.popleft()
        q = self._q
        if self._over or q is None or not q.items or not isinstance(q.items[0], _Chunk) or q.items[0].p is not p:
            self._peeked.clear()  # let go meanwhile: nothing is delivered any more
            return
        q.pop()
        self._delivered(p)

    async def aclose(self) -> None:
        """Stops reading, at once, even while another task waits for output."""
        self._closing = True
        if self._q is not None:
            self._q.wake()
        self._finish()

    def _finish(self) -> None:
        """Ends this iteration: the handle's consumer is free again; one that
        stopped (not at the output's end, nor on a broken connection, which
        a later output() resumes within kilnd's grace) is not read for any
        more, so the process must not wait for it."""
        if self._over:
            return
        self._over = True
        self._peeked.clear()  # not taken: not delivered, so read again after
        if not self._has_reading:
            return
        self._has_reading = False
        h = self._h
        h._reading = False
        if not self._whole and not self._broken:
            h._release()
        h._hang_up()
        if h._settings.mode == "finite":
            h._let_go(True)

    def __del__(self) -> None:
        # A loop left by break or return drops its iterator: reading stops
        # then, as it does for a TypeScript loop. Only the loop's thread
        # touches the handle.
        if self._over or not self._has_reading:
            return
        loop = self._h._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._finish()
        elif not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._finish)
            except RuntimeError:
                pass


class AsyncTerminalOutput:
    """A terminal's output: its bytes, stdout and stderr combined."""

    def __init__(self, inner: AsyncOutput[ByteChunk]) -> None:
        self._inner = inner

    def __aiter__(self) -> AsyncTerminalOutput:
        return self

    async def __anext__(self) -> bytes:
        return (await self._inner.__anext__()).bytes

    async def __aenter__(self) -> AsyncTerminalOutput:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._inner.aclose()
