"""A handle on one process: its output (replay, then live, resumed from
offsets, at the pace its reader reads), its input (in order, each write
once), its exit (confirmed, never guessed) and its control.

Everything here runs on one event loop; the synchronous client reaches it
from other threads through _sync's portal, never directly."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Generic, Literal, Protocol, TypeVar, cast

from ._errors import SandkilnError, error
from ._http import Dispatch, Transport, check_timeout, segment
from ._output import WINDOW, AsyncOutput, AsyncTerminalOutput, C, _Closed, _Failed, _Incoming, _Pending, _Queue
from ._types import (
    LIMITS,
    ByteChunk,
    Exit,
    ProcessReference,
    ProcessStatus,
    StreamCount,
    StreamName,
    TerminateResult,
    WaitResult,
    exit_of,
)
from ._websocket import ConnectionClosed, WebSocket

T = TypeVar("T")

@dataclass(frozen=True)
class Settings:
    """A handle's settings: what start() was given, or a reference records."""

    format: Literal["text", "bytes"]
    mode: Literal["stream", "finite"]
    max_output_bytes: int
    overflow: Literal["fail", "report"]
    hold: bool
    terminal: bool
    stdin_pipe: bool


class Owner(Protocol):
    """The sandbox a handle belongs to, as the handle needs it."""

    @property
    def id(self) -> str: ...

    @property
    def transport(self) -> Transport: ...

    def release(self, h: AsyncHandle[Any]) -> None:
        """Forgets a handle that was let go."""


def _futures(*fs: asyncio.Future[Any]) -> list[asyncio.Future[Any]]:
    return list(fs)


async def _after(prev: asyncio.Future[Any] | None, run: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """run(), once prev (an earlier input call) has ended, however it ended."""
    if prev is not None and not prev.done():
        await asyncio.wait(_futures(prev))
    return await run()


def _retrieve(f: asyncio.Future[Any]) -> None:
    """Marks a future's failure seen: a caller that stopped waiting for it
    does not make it an unretrieved exception."""
    if not f.cancelled():
        f.exception()


class _InputCall:
    """One write or close on its way through the input queue."""

    __slots__ = ("size", "queued", "aborted", "dispatch")

    def __init__(self, size: int) -> None:
        self.size = size
        self.queued = True  # it holds its room in the input queue
        self.aborted = False  # its caller stopped waiting before it was sent
        self.dispatch = Dispatch()

    @property
    def sent(self) -> bool:
        return self.dispatch.sent


class AsyncHandle(Generic[C]):
    """What processes and terminals have in common. Its methods may be
    called from several tasks at once; its output has one consumer at a
    time."""

    def __init__(self, owner: Owner, id: str, settings: Settings, ref: ProcessReference | None = None) -> None:
        self.id = id
        """The process's id in its sandbox."""
        self._owner = owner
        self._settings = settings
        self._loop = asyncio.get_running_loop()
        self._offsets: dict[str, int] = {}
        self._lost: dict[str, int] = {}
        self._ended: dict[str, bool] = {}
        self._exit: Exit | None = None
        self._delivered = 0  # bytes given out, for finite mode's bound
        self._gone = False
        # Done when the handle is let go: every call still waiting settles.
        self._life: asyncio.Future[None] = self._loop.create_future()
        self._reading = False
        # The output may be held for this handle: a release is owed when it
        # stops reading.
        self._holding = settings.hold
        self._ws: WebSocket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._queue: _Queue | None = None
        self._references: list[ProcessReference] = []
        # Input goes through one queue of calls, each sent after the last,
        # at the offset the last left.
        self._stdin_offset = 0
        self._stdin_closed = False
        self._closing: asyncio.Task[None] | None = None
        self._uncertain: SandkilnError | None = None
        self._input_tail: asyncio.Task[Any] | None = None
        self._input_bytes = 0
        self._input_calls = 0
        self._terminating: asyncio.Task[TerminateResult] | None = None
        self._terminate_error: SandkilnError | None = None
        if ref is not None:
            self._offsets = dict(ref["offsets"])
            self._lost = dict(ref["lost"])
            self._ended = dict(ref["ended"])
            self._stdin_offset = ref["stdin"]["offset"]
            self._stdin_closed = ref["stdin"]["closed"]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} of sandbox {self._owner.id}>"

    @property
    def _streams(self) -> tuple[StreamName, ...]:
        if self._settings.terminal:
            return ("terminal",)
        return ("stdout", "stderr")

    def _path(self, rest: str = "") -> str:
        return f"/sandboxes/{segment(self._owner.id)}/exec-stream/{segment(self.id)}{rest}"

    @property
    def output_gap(self) -> bool:
        """True when bytes were lost to this handle; lost_bytes says how many."""
        return self.lost_bytes > 0

    @property
    def lost_bytes(self) -> int:
        """Bytes reported lost to this handle, all streams together."""
        return sum(self._lost.values())

    def _detached(self) -> SandkilnError:
        return error("DETACHED", f"process {self.id}: the handle was detached or disconnected")

    # Output.

    async def _connect(self) -> _Queue:
        """Opens an output connection from where the handle stands; its
        messages go to a new queue."""
        self._hang_up()
        s = self._settings
        query: dict[str, str | int | bool | None] = {"credit": WINDOW}
        for name in self._streams:
            if self._offsets.get(name):
                query[name] = self._offsets[name]
        if s.hold:
            query.update(flow="block", ack="true")
        q = _Queue()
        self._queue = q
        incoming = _Incoming(self, q)
        try:
            ws = await self._owner.transport.websocket(self._path("/logs"), query, "kiln.v1")
        except SandkilnError as err:
            q.stopped = True
            if err.code == "UNAVAILABLE" and err.status is None:
                raise error("UNAVAILABLE", f"process {self.id}: output: {err}; call output() again to resume") from err
            raise
        except BaseException:
            q.stopped = True
            raise
        if self._gone:
            q.stopped = True
            ws.close()
            raise self._detached()
        self._ws = ws
        self._reader = self._loop.create_task(self._read_socket(ws, q, incoming.message))
        if s.hold:
            self._holding = True
        return q

    async def _read_socket(self, ws: WebSocket, q: _Queue, on_message: Callable[[str | bytes], None]) -> None:
        """Takes the connection's messages as they come (kilnd sends no more
        output than was granted), until it closes or is hung up."""
        try:
            while True:
                m = await ws.recv()
                if self._queue is q and not q.stopped:
                    on_message(m)
        except ConnectionClosed as c:
            if self._ws is ws:
                self._ws = None
            if not q.stopped:
                q.push(_Closed(c.code, c.reason))

    def _grant(self, n: int) -> None:
        """Gives kilnd back the credit of what the consumer took; a holding
        handle acks where it stands with it."""
        m: dict[str, Any] = {"type": "credit", "bytes": n}
        if self._settings.hold:
            m["offsets"] = self._offsets
        self._send(m)

    def _send(self, m: Mapping[str, Any]) -> None:
        if self._ws is not None:
            self._ws.send(json.dumps(m, separators=(",", ":")))

    def _release(self) -> None:
        """Lets go of the output held for this handle: the process no longer
        waits for it. On the output connection when there is one, else by a
        request of its own in the background, whose failure costs only
        kilnd's grace period of waiting."""
        if not self._holding:
            return
        self._holding = False
        if self._ws is not None and not self._ws.closed:
            self._send({"type": "release"})
            return
        t = self._owner.transport
        t.spawn(t.call("POST", self._path("/release"), idempotent=True))

    def _stop(self, q: _Queue, err: SandkilnError) -> None:
        """Lets the connection go: its queue ends with err."""
        q.stopped = True  # what comes after is not this queue's
        q.push(_Failed(err))

    def _hang_up(self) -> None:
        ws, self._ws = self._ws, None
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
        if ws is not None:
            ws.close()

    def _deliver(self, p: _Pending) -> None:
        s = p.stream
        self._offsets[s] = max(self._offsets.get(s, 0), p.next)
        if p.lost:
            self._lost[s] = self._lost.get(s, 0) + p.lost
        if p.end:
            self._ended[s] = True
        self._delivered += p.size
        for r in self._references:
            self._fill(r)

    def _complete(self) -> bool:
        return self.lost_bytes == 0 and all(self._ended.get(s) for s in self._streams) and not (self._exit and self._exit.output_cut)

    # Waiting, status and control.

    async def _with_life(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs coro, ending it with DETACHED if the handle goes first."""
        task = self._loop.create_task(coro)
        task.add_done_callback(_retrieve)
        try:
            await asyncio.wait(_futures(task, self._life), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        if task.done():
            return task.result()
        task.cancel()
        raise self._detached()

    async def _settle(self, fut: asyncio.Future[T], timeout: float | None, what: str) -> T:
        """Waits for a shared call: a timeout (WAIT_ABORTED) or a
        cancellation stops only this caller's wait; the handle going ends
        it with DETACHED."""
        await asyncio.wait(_futures(fut, self._life), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if fut.done():
            return fut.result()
        if self._life.done():
            raise self._detached()
        raise error("WAIT_ABORTED", f"{what}: timed out after {timeout} s")

    async def wait(self, *, timeout: float | None = None) -> WaitResult:
        """Waits for a confirmed exit. It has no timeout of its own: timeout
        (seconds) stops this wait alone (WAIT_ABORTED), as does cancelling
        it. A broken connection fails it (UNAVAILABLE); it never guesses an
        exit. An exit already confirmed (by an earlier wait, a status, or
        the output's end) is given without asking again, even after the
        handle was let go. A wait still pending when the handle goes fails
        with DETACHED. While nothing reads the output, the process no longer
        waits for this handle's reader: start reading before waiting."""
        check_timeout(timeout, "wait()")
        if self._exit is None:
            if self._gone:
                raise self._detached()
            if not self._reading:
                self._release()
            e = await self._with_life(self._owner.transport.call(
                "GET", self._path("/wait"), idempotent=True, unbounded=True, timeout=timeout))
            if self._exit is None:
                self._exit = exit_of(e)
        x = self._exit
        streams: dict[str, StreamCount] = {s: StreamCount(self._offsets.get(s, 0), self._lost.get(s, 0), self._ended.get(s, False)) for s in self._streams}
        return WaitResult(x.exit_code, x.signal, x.oom_killed, x.output_cut, self._complete(), streams)

    async def status(self, *, timeout: float | None = None) -> ProcessStatus:
        """What is known of the process now, without its output: "unknown"
        when kilnd cannot say (error says why); an exit already confirmed
        stays."""
        check_timeout(timeout, "status()")
        if self._gone:
            raise self._detached()
        try:
            p = await self._with_life(self._owner.transport.call("GET", self._path(), idempotent=True, timeout=timeout))
            now = datetime.now(timezone.utc)
            if p.get("state") == "exited":
                x = exit_of(p)
                cut = self._exit.output_cut if self._exit and self._exit.output_cut else x.output_cut
                self._exit = Exit(x.exit_code, x.signal, x.oom_killed, cut)
                return ProcessStatus("exited", now, exit=self._exit)
            return ProcessStatus("running", now)
        except SandkilnError as err:
            if err.code in ("WAIT_ABORTED", "DETACHED"):
                raise
            now = datetime.now(timezone.utc)
            if self._exit is not None:
                return ProcessStatus("exited", now, exit=self._exit, error=err)
            return ProcessStatus("unknown", now, error=err)

    async def signal(self, name: str, *, timeout: float | None = None) -> None:
        """Sends a signal ("SIGTERM", "SIGINT", "9") to the process's group.
        A process may ignore it: wait() confirms the exit."""
        if not isinstance(name, str) or not name:
            raise error("INVALID_ARGUMENT", "signal(): a signal's name or number is needed")
        check_timeout(timeout, "signal()")
        if self._gone:
            raise self._detached()
        await self._with_life(self._owner.transport.call("POST", self._path("/signal"), json={"signal": name}, timeout=timeout))

    async def terminate(self, *, timeout: float | None = None) -> TerminateResult:
        """Asks for the process group to be killed (SIGKILL). Success does
        not prove the exit: call wait(). Concurrent callers share one
        request, a timeout or cancellation stopping only its caller's wait;
        if the answer is lost, this and every later call fail with the same
        OUTCOME_UNKNOWN, nothing sent again."""
        check_timeout(timeout, "terminate()")
        if self._gone:
            raise self._detached()
        if self._terminate_error is not None:
            raise self._terminate_error
        if self._terminating is None:
            self._terminating = self._loop.create_task(self._terminate_once())
            self._terminating.add_done_callback(_retrieve)
        return await self._settle(self._terminating, timeout, "terminate()")

    async def _terminate_once(self) -> TerminateResult:
        try:
            p = await self._owner.transport.call("DELETE", self._path())
            exited = isinstance(p, dict) and p.get("state") == "exited"
            if exited and self._exit is None:
                self._exit = exit_of(p)
            return TerminateResult("exited" if exited else "requested")
        except SandkilnError as err:
            if err.code == "NOT_FOUND":
                return TerminateResult("not-found")
            if err.code == "OUTCOME_UNKNOWN":
                self._terminate_error = err
            raise
        finally:
            self._terminating = None

    # Input.

    async def write(self, data: str | bytes | bytearray | memoryview, *, timeout: float | None = None) -> None:
        """Sends data to the process's input after every earlier write: a
        str as UTF-8, bytes exactly (copied at the call). At most 64 KiB a
        write, and 256 KiB and 256 calls queued; writes go in the order
        their calls began. Success means kilnd accepted it, not that the
        program read it. A write whose timeout runs out (or that is
        cancelled) while it waits its turn is never sent; once sent, its
        outcome is then unknown. If the answer is lost, delivery is unknown
        and input is disabled (INPUT_UNCERTAIN); nothing is sent twice."""
        if isinstance(data, str):
            b = data.encode()
        elif isinstance(data, (bytes, bytearray, memoryview)):
            b = bytes(data)
        else:
            raise error("INVALID_ARGUMENT", f"write(): data must be str or bytes, not {type(data).__name__}")
        self._input_allowed()
        if len(b) > LIMITS.max_write_bytes:
            raise error("INVALID_ARGUMENT", f"a write carries at most {LIMITS.max_write_bytes} bytes, not {len(b)}: split it and await each")
        if self._input_bytes + len(b) > LIMITS.max_input_bytes or self._input_calls + 1 > LIMITS.max_input_calls:
            raise error("INPUT_CAPACITY", f"the input queue holds {LIMITS.max_input_bytes} bytes and "
                        f"{LIMITS.max_input_calls} calls; await earlier writes")
        check_timeout(timeout, "write()")
        deadline = None if timeout is None else self._loop.time() + timeout
        call = _InputCall(len(b))
        self._input_bytes += len(b)
        self._input_calls += 1
        job = self._enqueue(lambda: self._send_write(b, call, deadline))
        try:
            while True:
                left = None if deadline is None or call.sent else max(0.0, deadline - self._loop.time())
                await asyncio.wait(_futures(job, self._life), timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if job.done():
                    return job.result()
                if self._life.done():
                    self._leave(call)
                    raise self._detached()
                if not call.sent:
                    call.aborted = True
                    self._leave(call)
                    raise error("WAIT_ABORTED", f"write(): timed out after {timeout} s while queued; it was not sent")
                # Sent meanwhile: its request has what is left of the timeout.
        except asyncio.CancelledError:
            if call.sent:
                job.cancel()  # its outcome is then unknown, and input disabled
            else:
                call.aborted = True
                self._leave(call)
            raise

    async def _send_write(self, b: bytes, call: _InputCall, deadline: float | None) -> None:
        try:
            left = None if deadline is None else deadline - self._loop.time()
            if call.aborted or (left is not None and left <= 0):
                raise error("WAIT_ABORTED", "write(): timed out while queued; it was not sent")
            self._still_sending()
            acc = await self._owner.transport.call(
                "POST", self._path("/stdin"), query={"offset": self._stdin_offset}, body=b, timeout=left, dispatch=call.dispatch)
            self._stdin_offset = max(self._stdin_offset, int(acc["accepted"]))
        except BaseException as err:
            self._input_failed(err, call.dispatch)
            raise
        finally:
            self._leave(call)

    def _leave(self, call: _InputCall) -> None:
        """A write gives back its room in the input queue: sent, failed, or
        abandoned while it waited."""
        if call.queued:
            call.queued = False
            self._input_bytes -= call.size
            self._input_calls -= 1

    async def _close_input(self, timeout: float | None) -> None:
        if self._stdin_closed and not self._gone:
            return
        if self._closing is not None:
            return await self._settle(self._closing, timeout, "close_stdin()")
        self._input_allowed()
        check_timeout(timeout, "close_stdin()")
        self._closing = self._enqueue(self._send_close)
        self._closing.add_done_callback(_retrieve)
        return await self._settle(self._closing, timeout, "close_stdin()")

    async def _send_close(self) -> None:
        d = Dispatch()
        try:
            # Writes queued before it went first; only what happened since
            # (the handle gone, a write's outcome lost) stops it.
            self._still_sending()
            await self._owner.transport.call("POST", self._path("/stdin/close"), dispatch=d)
            self._stdin_closed = True
        except BaseException as err:
            self._input_failed(err, d)
            raise
        finally:
            self._closing = None

    def _enqueue(self, run: Callable[[], Coroutine[Any, Any, T]]) -> asyncio.Task[T]:
        """Runs run once every input call queued before it has ended."""
        t = self._loop.create_task(_after(self._input_tail, run))
        t.add_done_callback(_retrieve)
        self._input_tail = t
        return t

    def _input_allowed(self) -> None:
        """Refuses new input: the handle gone, no pipe, input uncertain, or
        stdin closed or closing."""
        if self._gone:
            raise self._detached()
        if not self._settings.stdin_pipe:
            raise error("STDIN_CLOSED", f'process {self.id} has no stdin pipe: start it with stdin="pipe"')
        if self._uncertain is not None:
            raise self._uncertain
        if self._stdin_closed or self._closing is not None:
            raise error("STDIN_CLOSED", f"process {self.id}: stdin is closed")

    def _still_sending(self) -> None:
        """What stops input already queued from being sent: the handle gone,
        or an earlier input's outcome lost."""
        if self._gone:
            raise self._detached()
        if self._uncertain is not None:
            raise self._uncertain

    def _input_failed(self, err: BaseException, d: Dispatch) -> None:
        lost = isinstance(err, SandkilnError) and err.code == "OUTCOME_UNKNOWN"
        if lost or (isinstance(err, asyncio.CancelledError) and d.sent):
            self._uncertain = error("INPUT_UNCERTAIN", f"process {self.id}: an earlier input's delivery is unknown; input is disabled")
            self._uncertain.__cause__ = err

    # References, and letting go.

    def reference(self) -> ProcessReference:
        """A reference to return to the process with reopen(), after
        disconnect(): plain JSON. It follows this handle until the handle is
        let go, so one taken before disconnect() resumes exactly where the
        output stood at the end. It refuses while an end-of-input is not
        acknowledged or input delivery is uncertain."""
        if self._gone:
            raise self._detached()
        if self._closing is not None:
            raise error("FAILED_PRECONDITION", f"process {self.id}: end-of-input is not acknowledged yet")
        if self._uncertain is not None:
            raise self._uncertain
        expires = datetime.fromtimestamp(time.time() + LIMITS.reference_lifetime, timezone.utc)
        r = cast(ProcessReference, {"expiresAt": expires.isoformat(timespec="milliseconds").replace("+00:00", "Z")})
        self._fill(r)
        self._references.append(r)
        return r

    def _fill(self, r: ProcessReference) -> None:
        s = self._settings
        r.update({
            "kind": "terminal" if s.terminal else "process",
            "version": 1,
            "sandbox": self._owner.id,
            "process": self.id,
            "offsets": dict(self._offsets),
            "lost": dict(self._lost),
            "ended": dict(self._ended),
            "stdin": {"pipe": s.stdin_pipe, "offset": self._stdin_offset, "closed": self._stdin_closed},
            "format": s.format,
            "mode": s.mode,
            "maxOutputBytes": s.max_output_bytes,
            "overflow": s.overflow,
            "hold": s.hold,
        })

    async def disconnect(self) -> None:
        """Releases this handle's connections, leaving the process, its
        stdin and the output it holds (for reopen(), within kilnd's grace)
        as they are; the handle refuses what comes after."""
        self._let_go(False)

    async def detach(self) -> None:
        """Releases this handle's connections and discards unread output;
        the process no longer waits for this handle. It never kills the
        process. Calling it again is safe."""
        self._let_go(True)

    def _let_go(self, release: bool) -> None:
        """Lets the handle go (detach, disconnect, its client closed, its
        sandbox destroyed through this client); with release, the output
        held for it too."""
        if self._gone:
            return
        if release:
            self._release()
        self._gone = True
        self._references = []
        q = self._queue
        if q is not None:
            q.stopped = True
        self._hang_up()
        if q is not None:
            q.clear()
            q.push(_Failed(self._detached()))
        if not self._life.done():
            self._life.set_result(None)
        self._owner.release(self)

    def _output(self, timeout: float | None) -> AsyncOutput[C]:
        return AsyncOutput(self, timeout)


class AsyncProcessHandle(AsyncHandle[C]):
    """A process on pipes: separate stdout and stderr, input with an
    explicit end."""

    def output(self, *, timeout: float | None = None) -> AsyncOutput[C]:
        """The output as chunks of text or bytes, replay then live; see
        AsyncOutput for the queue, holding, overflow and resuming."""
        return self._output(timeout)

    async def close_stdin(self, *, timeout: float | None = None) -> None:
        """Sends end-of-input (EOF) after earlier writes; later writes are
        refused. Closing again sends nothing."""
        await self._close_input(timeout)

    async def __aenter__(self) -> AsyncProcessHandle[C]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.detach()


class AsyncTerminalHandle(AsyncHandle[ByteChunk]):
    """A process on a terminal: one output stream of bytes, input through
    the terminal (Ctrl+D is input, not a close). It has no close_stdin()."""

    def output(self, *, timeout: float | None = None) -> AsyncTerminalOutput:
        """The terminal's output as bytes. Bytes lost to this handle fail it
        with OUTPUT_CAPACITY: a terminal's output is never given with gaps."""
        return AsyncTerminalOutput(self._output(timeout))

    async def resize(self, columns: int, rows: int, *, timeout: float | None = None) -> None:
        """Changes the terminal's size."""
        check_size(columns, rows)
        check_timeout(timeout, "resize()")
        await self._owner.transport.call("POST", self._path("/resize"), json={"cols": columns, "rows": rows},
                                         idempotent=True, timeout=timeout)

    async def __aenter__(self) -> AsyncTerminalHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.detach()


def check_size(columns: int, rows: int) -> None:
    for name, v in (("columns", columns), ("rows", rows)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v > 4096:
            raise error("INVALID_ARGUMENT", f"{name} {v!r}: want 1 to 4096")
