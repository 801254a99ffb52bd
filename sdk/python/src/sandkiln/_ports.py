"""A sandbox's ports reached through kilnd: HTTP by its port proxy, a TCP
connection carried over one WebSocket (kiln.tcp), and preview URLs that
reach a port without kilnd's token."""

from __future__ import annotations

import asyncio
from collections import deque
import builtins
from collections.abc import Callable, Mapping
from typing import Any, cast

from ._errors import SandkilnError, error
from ._http import Transport, check_timeout, segment
from ._streams import AsyncByteStream, Source, body_of
from ._types import Preview
from ._websocket import ConnectionClosed, WebSocket

# The bytes one message of a connection carries at most.
_MAX_MESSAGE = 64 << 10
# What a connection holds unread before it stops reading (TCP then holds
# the server back); below half of it, it reads again.
_MAX_UNREAD = 1 << 20

_IDEMPOTENT = {"GET", "HEAD", "OPTIONS"}


def _check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise error("INVALID_ARGUMENT", f"port {port!r}: want 1 to 65535")


class AsyncPorts:
    """A sandbox's ports, each reached on 127.0.0.1 inside it, with kilnd's token."""

    def __init__(self, t: Transport, path: Callable[[str], str], watch: Callable[[bool], None]) -> None:
        self._t = t
        self._path = path
        self._watch = watch
        self._open: set[AsyncPortConnection] = set()

    async def fetch(self, port: int, path: str, *, method: str = "GET", headers: Mapping[str, str] | None = None,
                    body: Source | None = None, timeout: float | None = None) -> AsyncByteStream:
        """An HTTP request to the server on port inside the sandbox, through
        kilnd's port proxy: path is the app's, with its query. The app's
        answer comes back whatever its status (the stream's status and
        headers, its body read as it comes); a redirect as it is (its
        Location under /sandboxes/{id}/ports/{port}), never followed.
        kilnd's own refusals are errors: UNAVAILABLE with kiln_code
        "bad_gateway" (status 502) when nothing listens on the port. The
        Authorization header is kilnd's token's; kilnd does not pass it on.
        No local timeout unless timeout: it bounds the whole exchange."""
        _check_port(port)
        m = method.upper()
        hdrs = {k: v for k, v in (headers or {}).items() if k.lower() != "authorization"}
        payload, length = body_of(body, f"port {port}") if body is not None else (None, None)
        check_timeout(timeout, "ports.fetch()")
        loop = asyncio.get_running_loop()
        start = loop.time()
        resp = await self._t.fetch(m, self._path(f"/ports/{port}/{path.lstrip('/')}"), headers=hdrs, body=payload,
                                   length=length, idempotent=m in _IDEMPOTENT, unbounded=True, timeout=timeout,
                                   is_error=lambda r: "Kiln-Error" in r.headers)
        left = None if timeout is None else max(timeout - (loop.time() - start), 1e-6)
        return AsyncByteStream(resp, f"port {port}", left)

    async def connect(self, port: int, *, timeout: float | None = None) -> AsyncPortConnection:
        """Opens a TCP connection to port inside the sandbox, carried over
        one WebSocket through kilnd, as kubectl port-forward carries one;
        it is given once the connection is made. Nothing listening is
        kilnd's error (UNAVAILABLE, kiln_code "bad_gateway")."""
        _check_port(port)
        check_timeout(timeout, "ports.connect()")
        ws = await self._t.websocket(self._path(f"/tcp/{port}"), None, "kiln.tcp", timeout=timeout)
        conn = AsyncPortConnection(port, ws, self._forget)
        self._open.add(conn)
        self._watch(True)
        return conn

    def _forget(self, conn: AsyncPortConnection) -> None:
        self._open.discard(conn)
        self._watch(False)

    def _close_all(self) -> None:
        for c in list(self._open):
            c._close_now()


class AsyncPortConnection:
    """A TCP connection to a port inside a sandbox. Iterate it for the
    server's bytes as they come (it ends when the server closes the
    connection; leaving the loop early leaves the connection open, and
    iterating again goes on where it stopped); write() sends bytes in
    order; close() ends it both ways (a WebSocket has no half close).
    While 1 MiB is unread it stops reading, and TCP holds the server back."""

    def __init__(self, port: int, ws: WebSocket, forget: Callable[[AsyncPortConnection], None]) -> None:
        self.port = port
        self._ws = ws
        self._forget = forget
        self._data: deque[bytes] = deque()
        self._unread = 0
        self._end: SandkilnError | None = None  # how it ended, once it did
        self._ended = False
        self._by_us = False
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._reading = False
        self._closed = asyncio.get_running_loop().create_future()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                await self._room.wait()
                m = await self._ws.recv()
                if isinstance(m, str) or not m:
                    continue  # kiln.tcp's messages are binary
                self._data.append(m)
                self._unread += len(m)
                if self._unread > _MAX_UNREAD:
                    self._room.clear()
                self._ready.set()
        except ConnectionClosed as c:
            if not self._by_us and c.code != 1000:
                self._end = error("UNAVAILABLE", f"port {self.port}: the connection broke off ({c.code}{': ' + c.reason if c.reason else ''})")
            self._done()

    def _done(self) -> None:
        self._ended = True
        self._ready.set()
        self._forget(self)
        if not self._closed.done():
            self._closed.set_result(None)

    def __aiter__(self) -> AsyncPortConnection:
        return self

    async def __anext__(self) -> bytes:
        if self._reading:
            raise error("OUTPUT_IN_USE", f"port {self.port}: the connection is being read already")
        self._reading = True
        try:
            while not self._data:
                if self._ended:
                    if self._end is not None:
                        raise self._end
                    raise StopAsyncIteration
                self._ready.clear()
                await self._ready.wait()
            b = self._data.popleft()
            self._unread -= len(b)
            if self._unread <= _MAX_UNREAD // 2:
                self._room.set()
            return b
        finally:
            self._reading = False

    async def write(self, data: bytes | str, *, timeout: float | None = None) -> None:
        """Sends bytes (a str as UTF-8) to the server, in order with earlier
        writes; it returns once the transport holds little unsent. After
        close() it is DETACHED; on a connection that ended, UNAVAILABLE."""
        b = data.encode() if isinstance(data, str) else bytes(data)
        check_timeout(timeout, "write()")
        try:
            async with asyncio.timeout(timeout):
                for i in range(0, len(b), _MAX_MESSAGE):
                    self._usable()
                    self._ws.send(b[i:i + _MAX_MESSAGE])
                    await self._ws.drain()
        except TimeoutError as err:
            raise error("WAIT_ABORTED", f"port {self.port}: write timed out; its bytes may have been sent") from err
        except ConnectionClosed as err:
            raise error("UNAVAILABLE", f"port {self.port}: the connection is closed") from err

    def _usable(self) -> None:
        if self._by_us:
            raise error("DETACHED", f"port {self.port}: the connection was closed")
        if self._ended or self._ws.closed:
            raise error("UNAVAILABLE", f"port {self.port}: the connection is closed")

    @property
    def closed(self) -> bool:
        return self._closed.done()

    async def wait_closed(self) -> None:
        """Returns once the connection is closed, by either end."""
        await asyncio.shield(self._closed)

    def _close_now(self) -> None:
        if self._by_us:
            return
        self._by_us = True
        self._data.clear()
        self._unread = 0
        self._ws.close()
        self._reader.cancel()
        self._done()

    async def close(self) -> None:
        """Closes the connection, both ways; what the server sent and was
        not read is dropped."""
        self._close_now()

    async def __aenter__(self) -> AsyncPortConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncPreviews:
    """Preview URLs: a sandbox's port reached without kilnd's token."""

    def __init__(self, t: Transport, path: Callable[[str], str]) -> None:
        self._t = t
        self._path = path

    async def create(self, port: int, *, ttl_seconds: int | None = None, timeout: float | None = None) -> Preview:
        """A preview of the port; its url (and token) are given this once.
        Starting a server does not publish its port: this does."""
        body: dict[str, Any] = {"port": port}
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        return cast(Preview, await self._t.call("POST", self._path("/previews"), json=body, timeout=timeout))

    async def list(self, *, timeout: float | None = None) -> builtins.list[Preview]:
        return cast("builtins.list[Preview]", await self._t.call("GET", self._path("/previews"), idempotent=True, timeout=timeout) or [])

    async def revoke(self, id: str, *, timeout: float | None = None) -> None:
        await self._t.call("DELETE", self._path(f"/previews/{segment(id)}"), idempotent=True, timeout=timeout)
