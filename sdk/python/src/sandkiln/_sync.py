"""The synchronous client: the asyncio client's code, run on an event loop
that a thread of the client's own keeps. Each call is handed to that loop
and waited for; everything the SDK does happens there, so that sync and
async behave alike by construction. Any thread may call; calls from several
threads run concurrently on the loop (one thread reading output while
another writes input, say)."""

from __future__ import annotations

import asyncio
import builtins
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar, overload

from ._client import AsyncClient, AsyncProcesses, AsyncSandbox, AsyncSandboxes, AsyncSnapshots, AsyncTerminals
from ._files import AsyncFiles
from ._images import AsyncImages
from ._nodes import AsyncNodes
from ._errors import error
from ._lines import ProcessLine, _async_lines, _Lines
from ._logs import AsyncLogs, Time
from ._ports import AsyncPortConnection, AsyncPorts, AsyncPreviews
from ._output import AsyncOutput, C
from ._process import AsyncHandle, AsyncProcessHandle, AsyncTerminalHandle
from ._streams import AsyncByteStream, Source
from ._types import (
    Event,
    ByteChunk,
    ByteOutput,
    CapturedLog,
    Command,
    ExecOutput,
    FileInfo,
    Health,
    ImageInfo,
    ImageProgress,
    LogRecord,
    NodeInfo,
    Preview,
    ProcessInfo,
    ProcessReference,
    ProcessStatus,
    SandboxInfo,
    SandboxReference,
    SandboxStats,
    SnapshotInfo,
    TopProcess,
    TerminateResult,
    TextChunk,
    TextOutput,
    Version,
    WaitResult,
)

T = TypeVar("T")
Y = TypeVar("Y")


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        # What is still running (a handle's background release, say) is
        # cancelled and awaited, so that the loop closes clean.
        tasks = asyncio.all_tasks(loop)
        for t in tasks:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    if loop.is_closed():
        return
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:
        return
    if threading.current_thread() is not thread:
        thread.join()


class _Portal:
    """The loop and its thread. The thread's target holds the loop, not the
    portal: a client dropped without close() stops its thread when the
    last object made through it goes."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=_serve, args=(self.loop,), name="sandkiln", daemon=True)
        self.thread.start()
        self._finalize = weakref.finalize(self, _stop, self.loop, self.thread)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs coro on the loop and waits for it. An interrupt (Ctrl-C)
        while it waits cancels it there, as asyncio's cancellation would."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("sandkiln: the synchronous client was called on its own loop: use AsyncClient in async code")
        if self.loop.is_closed():
            coro.close()
            raise error("DETACHED", "sandkiln: the client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            if not fut.done():
                fut.cancel()
                try:
                    fut.result(timeout=5)
                except BaseException:
                    pass
            raise

    def soon(self, fn: Callable[[], object]) -> None:
        """Runs fn on the loop, not waiting for it."""
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:
            pass  # the loop is closed: nothing is left to do there

    def stop(self) -> None:
        self._finalize()


async def _wait(aw: Awaitable[T]) -> T:
    return await aw


async def _step(it: AsyncIterator[Y]) -> tuple[bool, Y | None]:
    try:
        return True, await it.__anext__()
    except StopAsyncIteration:
        return False, None


def _in_thread(f: Callable[[Y], object]) -> Callable[[Y], Coroutine[Any, Any, object]]:
    """A synchronous callback, run in a worker thread so that it may block,
    and call the client, without holding up the loop."""

    async def call(v: Y) -> object:
        return await asyncio.to_thread(f, v)

    return call


class _Iter(Generic[Y]):
    """An async iterator, iterated from other threads."""

    def __init__(self, p: _Portal, it: AsyncIterator[Y], close: Callable[[], object] | None = None) -> None:
        self._p = p
        self._it = it
        self._close = close
        self._over = False

    def __iter__(self) -> _Iter[Y]:
        return self

    def __next__(self) -> Y:
        if self._over:
            raise StopIteration
        try:
            more, v = self._p.call(_step(self._it))
        except BaseException:
            self._over = True
            raise
        if not more:
            self._over = True
            raise StopIteration
        return v  # type: ignore[return-value]

    def close(self) -> None:
        """Stops iterating; what it holds is let go."""
        if not self._over:
            self._over = True
            if self._close is not None:
                self._p.soon(self._close)

    def __enter__(self) -> _Iter[Y]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


# The most chunks one call to the loop brings back: all the unread queue
# can hold.
_BATCH = 256


async def _next_batch(a: AsyncOutput[C]) -> list[C] | None:
    try:
        return await a._batch(_BATCH)
    except StopAsyncIteration:
        return None


class Output(Generic[C]):
    """A handle's output: ``for chunk in child.output()``. Leaving the loop
    (break, an exception, close(), a with block's end) stops reading, at
    once: in stream mode the process no longer waits for this handle, in
    finite mode the handle is detached. See AsyncOutput for the rest.

    Each call to the loop brings back the next chunk and those queued
    behind it; each of those is delivered (its offset counted, its credit
    returned) as the loop here takes it, so the queue's bounds hold what
    the consumer has not taken, as in the asynchronous client."""

    def __init__(self, p: _Portal, a: AsyncOutput[C]) -> None:
        self._p = p
        self._a = a
        self._buf: deque[C] = deque()
        self._unsettled = 0  # the last of _buf are chunks not yet delivered
        self._started = False
        self._over = False

    def __iter__(self) -> Output[C]:
        return self

    def __next__(self) -> C:
        self._started = True
        if not self._buf:
            if self._over:
                raise StopIteration
            try:
                batch = self._p.call(_next_batch(self._a))
            except BaseException:
                self._over = True
                raise
            if batch is None:
                self._over = True
                raise StopIteration
            self._buf.extend(batch)
            self._unsettled = len(batch) - 1
        if len(self._buf) <= self._unsettled:
            self._unsettled -= 1
            self._p.soon(self._a._settle)
        return self._buf.popleft()

    def close(self) -> None:
        """Stops reading; chunks brought back and not taken are not delivered."""
        if not self._over:
            self._over = True
            self._buf.clear()
            self._p.soon(self._a._finish)

    def __enter__(self) -> Output[C]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _lines(self, limit: int, timeout: float | None) -> Iterator[ProcessLine] | None:
        # read_process_lines over an output not iterated yet splits on the
        # loop, where a timeout can end a wait for output.
        if self._started:
            return None
        self._started = self._over = True
        return _Iter(self._p, _async_lines(self._a, _Lines(limit), timeout), self._a._finish)


class TerminalOutput:
    """A terminal's output as bytes: ``for data in term.output()``."""

    def __init__(self, p: _Portal, a: AsyncOutput[ByteChunk]) -> None:
        self._out = Output(p, a)

    def __iter__(self) -> TerminalOutput:
        return self

    def __next__(self) -> bytes:
        return self._out.__next__().bytes

    def close(self) -> None:
        self._out.close()

    def __enter__(self) -> TerminalOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lines(self, limit: int, timeout: float | None) -> Iterator[ProcessLine] | None:
        return self._out._lines(limit, timeout)


class _Handle(Generic[C]):
    def __init__(self, p: _Portal, a: AsyncHandle[C]) -> None:
        self._p = p
        self._h: AsyncHandle[C] = a

    def __repr__(self) -> str:
        return repr(self._h).replace("<Async", "<", 1)

    @property
    def id(self) -> str:
        return self._h.id

    @property
    def output_gap(self) -> bool:
        """True when bytes were lost to this handle; lost_bytes says how many."""
        return self._h.output_gap

    @property
    def lost_bytes(self) -> int:
        return self._h.lost_bytes

    def write(self, data: str | bytes | bytearray | memoryview, *, timeout: float | None = None) -> None:
        """See AsyncHandle.write: in order, each write once, 64 KiB at most."""
        self._p.call(self._h.write(data, timeout=timeout))

    def wait(self, *, timeout: float | None = None) -> WaitResult:
        """Waits for a confirmed exit; timeout stops this wait alone (WAIT_ABORTED)."""
        return self._p.call(self._h.wait(timeout=timeout))

    def status(self, *, timeout: float | None = None) -> ProcessStatus:
        return self._p.call(self._h.status(timeout=timeout))

    def signal(self, name: str, *, timeout: float | None = None) -> None:
        self._p.call(self._h.signal(name, timeout=timeout))

    def terminate(self, *, timeout: float | None = None) -> TerminateResult:
        return self._p.call(self._h.terminate(timeout=timeout))

    def reference(self) -> ProcessReference:
        return self._p.call(_sync_value(self._h.reference))

    def disconnect(self) -> None:
        self._p.call(self._h.disconnect())

    def detach(self) -> None:
        self._p.call(self._h.detach())


async def _sync_value(f: Callable[[], T]) -> T:
    return f()


async def _bounded(aw: Awaitable[T], timeout: float | None, what: str) -> T:
    try:
        return await asyncio.wait_for(aw, timeout)
    except TimeoutError as err:
        raise error("WAIT_ABORTED", f"{what}: timed out after {timeout} s") from err


class ProcessHandle(_Handle[C]):
    """A process on pipes; see AsyncProcessHandle. ``with`` detaches it at
    the block's end."""

    def __init__(self, p: _Portal, a: AsyncProcessHandle[C]) -> None:
        super().__init__(p, a)
        self._a: AsyncProcessHandle[C] = a

    def output(self, *, timeout: float | None = None) -> Output[C]:
        return Output(self._p, self._a.output(timeout=timeout))

    def close_stdin(self, *, timeout: float | None = None) -> None:
        self._p.call(self._a.close_stdin(timeout=timeout))

    def __enter__(self) -> ProcessHandle[C]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


class TerminalHandle(_Handle[ByteChunk]):
    """A process on a terminal; see AsyncTerminalHandle."""

    def __init__(self, p: _Portal, a: AsyncTerminalHandle) -> None:
        super().__init__(p, a)
        self._a = a

    def output(self, *, timeout: float | None = None) -> TerminalOutput:
        return TerminalOutput(self._p, self._a._output(timeout))

    def resize(self, columns: int, rows: int, *, timeout: float | None = None) -> None:
        self._p.call(self._a.resize(columns, rows, timeout=timeout))

    def __enter__(self) -> TerminalHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def _handle(p: _Portal, a: AsyncProcessHandle[Any] | AsyncTerminalHandle) -> ProcessHandle[Any] | TerminalHandle:
    return TerminalHandle(p, a) if isinstance(a, AsyncTerminalHandle) else ProcessHandle(p, a)


class ByteStream(_Iter[bytes]):
    """An answer's body as it comes: ``for chunk in stream``, or read().
    Close it (``with``, close()) if it is not read to its end."""

    def __init__(self, p: _Portal, a: AsyncByteStream) -> None:
        super().__init__(p, a, a.close_now)
        self._a = a
        self.status = a.status
        self.headers = a.headers
        self.info = a.info

    @property
    def trailers(self) -> Any:
        """The trailer fields, once the body was read to its end."""
        return self._a.trailers

    def read(self) -> bytes:
        """The rest of the body, whole."""
        return self._p.call(self._a.read())

    def __enter__(self) -> ByteStream:
        return self


class PortConnection(_Iter[bytes]):
    """A TCP connection to a port inside a sandbox; see AsyncPortConnection.
    Iterating it gives the server's bytes; leaving a loop early leaves it
    open, and iterating again goes on where it stopped."""

    def __init__(self, p: _Portal, a: AsyncPortConnection) -> None:
        super().__init__(p, a)
        self._a = a
        self.port = a.port

    def __next__(self) -> bytes:
        self._over = False  # iterating again goes on where it stopped
        return super().__next__()

    def write(self, data: bytes | str, *, timeout: float | None = None) -> None:
        self._p.call(self._a.write(data, timeout=timeout))

    def close(self) -> None:
        self._over = True
        self._p.call(self._a.close())

    @property
    def closed(self) -> bool:
        return self._a.closed

    def wait_closed(self, *, timeout: float | None = None) -> None:
        self._p.call(_bounded(self._a.wait_closed(), timeout, f"port {self.port}: wait_closed()"))

    def __enter__(self) -> PortConnection:
        return self

    def __del__(self) -> None:
        pass  # a dropped connection stays open until close(), as a socket would


class Client:
    """Talks to one kilnd, from any thread. url defaults to $KILN_ADDR
    ("127.0.0.1:7777", "http://…", "unix:///…/kilnd.sock"), token to
    $KILN_TOKEN. ``with Client() as client`` closes it at the block's end;
    close() also stops the thread it runs its event loop on."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self._a = AsyncClient(url, token)
        self._p = _Portal()
        self.sandboxes = Sandboxes(self._p, self._a.sandboxes)
        self.images = Images(self._p, self._a.images)
        self.snapshots = Snapshots(self._p, self._a.snapshots)
        self.nodes = Nodes(self._p, self._a.nodes)

    @property
    def url(self) -> str:
        return self._a.url

    def health(self, *, timeout: float | None = None) -> bool:
        return self._p.call(self._a.health(timeout=timeout))

    def ready(self, *, timeout: float | None = None) -> Health:
        """See AsyncClient.ready: kilnd's 503 (its cluster down) is its
        health, not an error."""
        return self._p.call(self._a.ready(timeout=timeout))

    def version(self, *, timeout: float | None = None) -> Version:
        return self._p.call(self._a.version(timeout=timeout))

    def events(self, *, after: int = 0, sandbox: str | None = None, type: str | None = None,
               node: str | None = None, follow: bool = True) -> Iterator[Event]:
        """See AsyncClient.events: ``for event in client.events()``."""
        it = self._a.events(after=after, sandbox=sandbox, type=type, node=node, follow=follow)
        return _Iter(self._p, it, lambda: asyncio.ensure_future(it.aclose()))

    def close(self) -> None:
        """Lets go of every handle made through this client (see
        AsyncClient.close), then stops its event loop's thread."""
        if not self._p.loop.is_closed():
            self._p.call(self._a.close())
        self._p.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Sandboxes:
    def __init__(self, p: _Portal, a: AsyncSandboxes) -> None:
        self._p = p
        self._a = a

    def create(self, *, name: str | None = None, hostname: str | None = None, image: str | None = None, rootfs: str | None = None,
               runtime: str | None = None, limits: Mapping[str, int | float] | None = None, network: Mapping[str, Any] | None = None,
               init: Mapping[str, Any] | None = None, idle_timeout_seconds: int | None = None, ttl_seconds: int | None = None, logs: Mapping[str, int] | None = None,
               on_oom: str | None = None, labels: Mapping[str, str] | None = None, mounts: Sequence[Mapping[str, Any]] | None = None,
               snapshot: str | None = None, node: str | None = None, constraints: Sequence[str] | None = None,
               timeout: float | None = None) -> Sandbox:
        """Creates a sandbox; see AsyncSandboxes.create. ``with
        client.sandboxes.create() as sandbox`` destroys it at the block's end."""
        a = self._p.call(_wait(self._a.create(
            name=name, hostname=hostname, image=image, rootfs=rootfs, runtime=runtime, limits=limits, network=network,
            init=init, idle_timeout_seconds=idle_timeout_seconds, ttl_seconds=ttl_seconds, logs=logs, on_oom=on_oom, labels=labels, mounts=mounts,
            snapshot=snapshot, node=node, constraints=constraints, timeout=timeout)))
        return Sandbox(self._p, a)

    def get(self, sandbox: str | SandboxReference | Mapping[str, Any], *, timeout: float | None = None) -> Sandbox:
        return Sandbox(self._p, self._p.call(self._a.get(sandbox, timeout=timeout)))

    def list(self, *, label: str | Sequence[str] | Mapping[str, str] | None = None, name: str | None = None,
             state: str | None = None, image: str | None = None, runtime: str | None = None, node: str | None = None,
             all: bool = False, timeout: float | None = None) -> builtins.list[SandboxInfo]:
        """See AsyncSandboxes.list."""
        return self._p.call(self._a.list(label=label, name=name, state=state, image=image, runtime=runtime, node=node, all=all,
                                         timeout=timeout))

    def delete(self, sandbox: str | SandboxReference | Mapping[str, Any] | Sandbox, *, remove_logs: bool = False,
               timeout: float | None = None) -> None:
        """See AsyncSandboxes.delete."""
        target = sandbox._a if isinstance(sandbox, Sandbox) else sandbox
        self._p.call(self._a.delete(target, remove_logs=remove_logs, timeout=timeout))


class Sandbox:
    """A handle on a sandbox; see AsyncSandbox. ``with sandbox`` destroys it
    at the block's end."""

    def __init__(self, p: _Portal, a: AsyncSandbox) -> None:
        self._p = p
        self._a = a
        self.id = a.id
        self.name = a.name
        self.processes = Processes(p, a.processes)
        self.terminals = Terminals(p, a.terminals)
        self.files = Files(p, a.files)
        self.previews = Previews(p, a.previews)
        self.logs = Logs(p, a.logs)
        self.ports = Ports(p, a.ports)

    def __repr__(self) -> str:
        return f"<Sandbox {self.id}>"

    @property
    def info(self) -> SandboxInfo:
        return self._a.info

    @property
    def reference(self) -> SandboxReference:
        return self._a.reference

    def refresh(self, *, timeout: float | None = None) -> SandboxInfo:
        return self._p.call(self._a.refresh(timeout=timeout))

    def stats(self, *, timeout: float | None = None) -> SandboxStats:
        return self._p.call(self._a.stats(timeout=timeout))

    def top(self, *, timeout: float | None = None) -> list[TopProcess]:
        """See AsyncSandbox.top."""
        return self._p.call(self._a.top(timeout=timeout))

    def stop(self, *, timeout_seconds: int | None = None, timeout: float | None = None) -> SandboxInfo:
        """See AsyncSandbox.stop."""
        return self._p.call(self._a.stop(timeout_seconds=timeout_seconds, timeout=timeout))

    def start(self, *, timeout: float | None = None) -> SandboxInfo:
        """See AsyncSandbox.start."""
        return self._p.call(self._a.start(timeout=timeout))

    def restart(self, *, timeout_seconds: int | None = None, timeout: float | None = None) -> SandboxInfo:
        """See AsyncSandbox.restart."""
        return self._p.call(self._a.restart(timeout_seconds=timeout_seconds, timeout=timeout))

    def snapshot(self, *, name: str | None = None, memory: bool = False, timeout: float | None = None) -> SnapshotInfo:
        """See AsyncSandbox.snapshot."""
        return self._p.call(self._a.snapshot(name=name, memory=memory, timeout=timeout))

    def snapshots(self, *, timeout: float | None = None) -> builtins.list[SnapshotInfo]:
        """See AsyncSandbox.snapshots."""
        return self._p.call(self._a.snapshots(timeout=timeout))

    def rollback(self, snapshot: str, *, timeout_seconds: int | None = None, timeout: float | None = None) -> SandboxInfo:
        """See AsyncSandbox.rollback."""
        return self._p.call(self._a.rollback(snapshot, timeout_seconds=timeout_seconds, timeout=timeout))

    def fork(self, *, count: int | None = None, labels: Mapping[str, str] | None = None,
             files_only: bool = False, timeout: float | None = None) -> builtins.list[Sandbox]:
        """See AsyncSandbox.fork."""
        return [Sandbox(self._p, a) for a in self._p.call(self._a.fork(count=count, labels=labels, files_only=files_only, timeout=timeout))]

    def pause(self, *, timeout: float | None = None) -> SandboxInfo:
        """See AsyncSandbox.pause."""
        return self._p.call(self._a.pause(timeout=timeout))

    def resume(self, *, timeout: float | None = None) -> SandboxInfo:
        """See AsyncSandbox.resume."""
        return self._p.call(self._a.resume(timeout=timeout))

    def destroy(self, *, remove_logs: bool = False, timeout: float | None = None) -> None:
        self._p.call(self._a.destroy(remove_logs=remove_logs, timeout=timeout))

    def exec(self, command: Command, *, cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None,
             stdin: str | bytes | None = None, max_output_bytes: int | None = None, deadline_seconds: float | None = None,
             on_output: Callable[[TextChunk], object] | None = None, timeout: float | None = None) -> ExecOutput:
        """See AsyncSandbox.exec; on_output runs in a worker thread, each
        call waited for before the next."""
        return self._p.call(self._a.exec(
            command, cwd=cwd, env=env, user=user, stdin=stdin, max_output_bytes=max_output_bytes,
            deadline_seconds=deadline_seconds, on_output=_in_thread(on_output) if on_output is not None else None, timeout=timeout))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class Processes:
    def __init__(self, p: _Portal, a: AsyncProcesses) -> None:
        self._p = p
        self._a = a

    @overload
    def start(self, command: Command, *, output: ByteOutput, stdin: Literal["pipe", "closed"] = "closed",
              cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None, capture: bool = False,
              drain_ms: int | None = None, timeout: float | None = None,
              deadline_seconds: None = None) -> ProcessHandle[ByteChunk]: ...

    @overload
    def start(self, command: Command, *, output: TextOutput | None = None, stdin: Literal["pipe", "closed"] = "closed",
              cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None, capture: bool = False,
              drain_ms: int | None = None, timeout: float | None = None,
              deadline_seconds: None = None) -> ProcessHandle[TextChunk]: ...

    def start(self, command: Command, *, output: TextOutput | ByteOutput | None = None, stdin: Literal["pipe", "closed"] = "closed",
              cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None, capture: bool = False,
              drain_ms: int | None = None, timeout: float | None = None,
              deadline_seconds: None = None) -> ProcessHandle[ByteChunk] | ProcessHandle[TextChunk]:
        """Starts a process and gives its handle at once; see
        AsyncProcesses.start."""
        a = self._p.call(self._a._start(command, output, stdin, cwd, env, user, capture, drain_ms, timeout, deadline_seconds))
        return ProcessHandle(self._p, a)

    def reopen(self, ref: ProcessReference, *, timeout: float | None = None) -> ProcessHandle[Any]:
        return ProcessHandle(self._p, self._p.call(self._a.reopen(ref, timeout=timeout)))

    def get(self, id: str, *, format: Literal["text", "bytes"] = "text", overflow: Literal["fail", "report"] = "fail",
            timeout: float | None = None) -> ProcessHandle[Any] | TerminalHandle:
        return _handle(self._p, self._p.call(self._a.get(id, format=format, overflow=overflow, timeout=timeout)))

    def list(self, *, timeout: float | None = None) -> builtins.list[ProcessInfo]:
        return self._p.call(self._a.list(timeout=timeout))


class Terminals:
    def __init__(self, p: _Portal, a: AsyncTerminals) -> None:
        self._p = p
        self._a = a

    def start(self, command: Command, *, columns: int = 80, rows: int = 24, cwd: str | None = None,
              env: Mapping[str, str] | None = None, user: str | None = None, capture: bool = False,
              drain_ms: int | None = None, timeout: float | None = None) -> TerminalHandle:
        return TerminalHandle(self._p, self._p.call(_wait(self._a.start(
            command, columns=columns, rows=rows, cwd=cwd, env=env, user=user, capture=capture, drain_ms=drain_ms, timeout=timeout))))

    def reopen(self, ref: ProcessReference, *, timeout: float | None = None) -> TerminalHandle:
        return TerminalHandle(self._p, self._p.call(self._a.reopen(ref, timeout=timeout)))


class Files:
    """A sandbox's files; see AsyncFiles. Bodies stream both ways."""

    def __init__(self, p: _Portal, a: AsyncFiles) -> None:
        self._p = p
        self._a = a

    def read(self, path: str, *, timeout: float | None = None) -> bytes:
        return self._p.call(self._a.read(path, timeout=timeout))

    def read_text(self, path: str, *, timeout: float | None = None) -> str:
        return self._p.call(self._a.read_text(path, timeout=timeout))

    def read_stream(self, path: str, *, timeout: float | None = None) -> ByteStream:
        return ByteStream(self._p, self._p.call(self._a.read_stream(path, timeout=timeout)))

    def write(self, path: str, data: Source, *, mode: str | None = None, timeout: float | None = None) -> FileInfo:
        return self._p.call(self._a.write(path, data, mode=mode, timeout=timeout))

    def list(self, path: str, *, timeout: float | None = None) -> builtins.list[FileInfo]:
        return self._p.call(self._a.list(path, timeout=timeout))

    def stat(self, path: str, *, timeout: float | None = None) -> FileInfo:
        return self._p.call(self._a.stat(path, timeout=timeout))

    def remove(self, path: str, *, recursive: bool = False, timeout: float | None = None) -> None:
        self._p.call(self._a.remove(path, recursive=recursive, timeout=timeout))

    def mkdir(self, path: str, *, timeout: float | None = None) -> FileInfo:
        return self._p.call(self._a.mkdir(path, timeout=timeout))

    def move(self, src: str, dst: str, *, timeout: float | None = None) -> FileInfo:
        return self._p.call(self._a.move(src, dst, timeout=timeout))

    def archive(self, path: str, *, timeout: float | None = None) -> ByteStream:
        return ByteStream(self._p, self._p.call(self._a.archive(path, timeout=timeout)))

    def extract(self, dir: str, tar: Source, *, timeout: float | None = None) -> FileInfo:
        return self._p.call(self._a.extract(dir, tar, timeout=timeout))


class Previews:
    def __init__(self, p: _Portal, a: AsyncPreviews) -> None:
        self._p = p
        self._a = a

    def create(self, port: int, *, ttl_seconds: int | None = None, timeout: float | None = None) -> Preview:
        return self._p.call(self._a.create(port, ttl_seconds=ttl_seconds, timeout=timeout))

    def list(self, *, timeout: float | None = None) -> builtins.list[Preview]:
        return self._p.call(self._a.list(timeout=timeout))

    def revoke(self, id: str, *, timeout: float | None = None) -> None:
        self._p.call(self._a.revoke(id, timeout=timeout))


class Snapshots:
    """kilnd's snapshots; see AsyncSnapshots."""

    def __init__(self, p: _Portal, a: AsyncSnapshots) -> None:
        self._p = p
        self._a = a

    def list(self, *, sandbox: str | None = None, timeout: float | None = None) -> builtins.list[SnapshotInfo]:
        return self._p.call(self._a.list(sandbox=sandbox, timeout=timeout))

    def get(self, ref: str, *, timeout: float | None = None) -> SnapshotInfo:
        return self._p.call(self._a.get(ref, timeout=timeout))

    def remove(self, ref: str, *, timeout: float | None = None) -> None:
        self._p.call(self._a.remove(ref, timeout=timeout))

    def export(self, ref: str, *, timeout: float | None = None) -> ByteStream:
        """See AsyncSnapshots.export; the stream is read from any thread."""
        return ByteStream(self._p, self._p.call(self._a.export(ref, timeout=timeout)))

    def import_(self, tar: Source, *, timeout: float | None = None) -> SnapshotInfo:
        return self._p.call(self._a.import_(tar, timeout=timeout))


class Nodes:
    """The nodes of kilnd's cluster; see AsyncNodes."""

    def __init__(self, p: _Portal, a: AsyncNodes) -> None:
        self._p = p
        self._a = a

    def list(self, *, timeout: float | None = None) -> builtins.list[NodeInfo]:
        return self._p.call(self._a.list(timeout=timeout))

    def get(self, name: str, *, timeout: float | None = None) -> NodeInfo:
        return self._p.call(self._a.get(name, timeout=timeout))

    def drain(self, name: str, *, move_stopped: bool = False, timeout: float | None = None) -> NodeInfo:
        """See AsyncNodes.drain."""
        return self._p.call(self._a.drain(name, move_stopped=move_stopped, timeout=timeout))

    def undrain(self, name: str, *, timeout: float | None = None) -> NodeInfo:
        return self._p.call(self._a.undrain(name, timeout=timeout))


class Images:
    def __init__(self, p: _Portal, a: AsyncImages) -> None:
        self._p = p
        self._a = a

    def list(self, *, timeout: float | None = None) -> builtins.list[ImageInfo]:
        return self._p.call(self._a.list(timeout=timeout))

    def get(self, name: str, *, timeout: float | None = None) -> ImageInfo:
        return self._p.call(self._a.get(name, timeout=timeout))

    def remove(self, name: str, *, timeout: float | None = None) -> None:
        self._p.call(self._a.remove(name, timeout=timeout))

    def pull(self, ref: str, *, on_progress: Callable[[ImageProgress], object] | None = None,
             timeout: float | None = None) -> ImageInfo:
        return self._p.call(self._a.pull(ref, on_progress=_in_thread(on_progress) if on_progress else None, timeout=timeout))

    def import_(self, tar: Source, *, on_progress: Callable[[ImageProgress], object] | None = None,
                timeout: float | None = None) -> builtins.list[ImageInfo]:
        return self._p.call(self._a.import_(tar, on_progress=_in_thread(on_progress) if on_progress else None, timeout=timeout))


class Logs:
    """A sandbox's captured logs; see AsyncLogs."""

    def __init__(self, p: _Portal, a: AsyncLogs) -> None:
        self._p = p
        self._a = a

    def list(self, *, timeout: float | None = None) -> builtins.list[CapturedLog]:
        return self._p.call(self._a.list(timeout=timeout))

    def read(self, pid: str, *, stream: Literal["stdout", "stderr"] | None = None, tail: int | None = None,
             since: Time | None = None, until: Time | None = None, follow: bool = False,
             source: Literal["best", "log"] | None = None, timeout: float | None = None) -> ByteStream:
        return ByteStream(self._p, self._p.call(self._a.read(
            pid, stream=stream, tail=tail, since=since, until=until, follow=follow, source=source, timeout=timeout)))

    def records(self, pid: str, *, stream: Literal["stdout", "stderr"] | None = None, tail: int | None = None,
                since: Time | None = None, until: Time | None = None, follow: bool = False,
                source: Literal["best", "log"] | None = None, timeout: float | None = None) -> Iterator[LogRecord]:
        it = self._a.records(pid, stream=stream, tail=tail, since=since, until=until, follow=follow, source=source, timeout=timeout)
        return _Iter(self._p, it, lambda: asyncio.ensure_future(it.aclose()))


class Ports:
    """A sandbox's ports; see AsyncPorts."""

    def __init__(self, p: _Portal, a: AsyncPorts) -> None:
        self._p = p
        self._a = a

    def fetch(self, port: int, path: str, *, method: str = "GET", headers: Mapping[str, str] | None = None,
              body: Source | None = None, timeout: float | None = None) -> ByteStream:
        return ByteStream(self._p, self._p.call(self._a.fetch(port, path, method=method, headers=headers, body=body, timeout=timeout)))

    def connect(self, port: int, *, timeout: float | None = None) -> PortConnection:
        return PortConnection(self._p, self._p.call(self._a.connect(port, timeout=timeout)))


