"""HTTP/1.1 to kilnd on asyncio streams: one request at a time per
connection, bounded, authenticated, and honest about what a failure means
(not sent, refused, or sent with its answer lost). The WebSocket handshake
is an HTTP request too, and is made here."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json as jsonlib
import os
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from ._errors import SandkilnError, error, from_answer
from ._websocket import WebSocket

# How long a control request may take; waits, downloads and uploads have no
# local bound, and the caller's timeout alone ends them.
CONTROL_TIMEOUT = 30.0

_MAX_ERROR_BODY = 64 << 10
_MAX_HEAD = 256 << 10  # a response's headers, or its trailers
_READ = 256 << 10  # what one read of a body asks for
_IDLE = 8  # idle connections kept for reuse
_WS_MAX_MESSAGE = 16 << 20
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


Query = Mapping[str, "str | int | bool | Sequence[str] | None"]
"""Query parameters; None leaves one out."""


class Headers:
    """A message's header fields, their names compared without case."""

    def __init__(self, items: list[tuple[str, str]] | None = None) -> None:
        self.items: list[tuple[str, str]] = items or []

    def get(self, name: str, default: str | None = None) -> str | None:
        low = name.lower()
        for k, v in self.items:
            if k.lower() == low:
                return v
        return default

    def get_all(self, name: str) -> list[str]:
        low = name.lower()
        return [v for k, v in self.items if k.lower() == low]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __repr__(self) -> str:
        return f"Headers({self.items!r})"


@dataclass
class Dispatch:
    """Whether a request's bytes began to go: after that, a failure leaves
    its outcome unknown."""

    sent: bool = False


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False

    def abort(self) -> None:
        self.writer.close()


class _Refused(Exception):
    """The connection was never made: nothing was sent."""


class _BrokeOff(Exception):
    """The connection broke while a message was exchanged."""


class _WriteFailed(Exception):
    """Writing the request to the connection failed (its cause says why);
    a failure of the body's source is not this, and goes up as it is."""


class Response:
    """An answer whose body is read as it comes. Read it to its end (read(),
    or iterate it) or close() it; a connection whose answer was read whole
    is used again."""

    def __init__(self, transport: Transport, conn: _Conn, method: str, status: int, reason: str, headers: Headers, what: str) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        # The chunked body's trailer fields, once the body was read to its end.
        self.trailers = Headers()
        self._t = transport
        self._conn: _Conn | None = conn
        self._what = what
        self._keep = (headers.get("Connection") or "").lower() != "close"
        te = (headers.get("Transfer-Encoding") or "").lower()
        cl = headers.get("Content-Length")
        self._chunk_left = 0  # bytes left of the chunk being read
        # The whole body, when the request asked for it read.
        self.body = b""
        if status == 101:
            # The connection is the protocol's now, not an HTTP one's.
            self._mode, self._left, self._conn = "none", 0, None
            return
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            self._mode, self._left = "none", 0
        elif "chunked" in te:
            self._mode, self._left = "chunked", 0
        elif cl is not None and cl.strip().isdigit():
            self._mode, self._left = "length", int(cl)
        else:
            self._mode, self._left, self._keep = "close", 0, False
        if self._mode == "none" or (self._mode == "length" and self._left == 0):
            self._finish()

    @property
    def done(self) -> bool:
        """The body was read to its end (or closed)."""
        return self._conn is None

    def _finish(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._keep:
                self._t._idle(conn)
            else:
                conn.abort()

    def close(self) -> None:
        """Lets the answer go; a body not read to its end ends its connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()

    async def read_some(self, limit: int = _READ) -> bytes:
        """The body's next bytes, at most limit; b"" at its end. UNAVAILABLE
        when the answer breaks off."""
        conn = self._conn
        if conn is None:
            return b""
        try:
            if self._mode == "length":
                b = await conn.reader.read(min(limit, self._left))
                if not b:
                    raise _BrokeOff(f"{self._left} bytes of the body missing")
                self._left -= len(b)
                if self._left == 0:
                    self._finish()
                return b
            if self._mode == "close":
                b = await conn.reader.read(limit)
                if not b:
                    self._finish()
                return b
            # chunked
            while self._chunk_left == 0:
                line = await conn.reader.readuntil(b"\r\n")
                size = int(line.split(b";", 1)[0].strip() or b"x", 16)
                if size == 0:
                    self.trailers = await _read_fields(conn.reader)
                    self._finish()
                    return b""
                self._chunk_left = size
            b = await conn.reader.read(min(limit, self._chunk_left))
            if not b:
                raise _BrokeOff("the body ended inside a chunk")
            self._chunk_left -= len(b)
            if self._chunk_left == 0:
                if await conn.reader.readexactly(2) != b"\r\n":
                    raise _BrokeOff("a chunk without its CRLF")
            return b
        except asyncio.CancelledError:
            self.close()
            raise
        except (_BrokeOff, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError) as err:
            self.close()
            raise error("UNAVAILABLE", f"{self._what}: the answer broke off: {_describe(err)}") from err

    async def read(self) -> bytes:
        """The rest of the body, whole."""
        parts: list[bytes] = []
        while True:
            b = await self.read_some()
            if not b:
                return b"".join(parts)
            parts.append(b)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            b = await self.read_some()
            if not b:
                return
            yield b


async def _read_fields(reader: asyncio.StreamReader) -> Headers:
    """Header fields up to the empty line."""
    items: list[tuple[str, str]] = []
    size = 0
    while True:
        line = await reader.readuntil(b"\r\n")
        size += len(line)
        if size > _MAX_HEAD:
            raise _BrokeOff("headers too large")
        if line == b"\r\n":
            return Headers(items)
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise _BrokeOff(f"a malformed header line {line[:40]!r}")
        items.append((name.strip(), value.strip()))


def _describe(err: BaseException) -> str:
    s = str(err)
    return f"{type(err).__name__}: {s}" if s else type(err).__name__


class Transport:
    """Where kilnd is and how to prove who we are; the connections to it.
    Its methods run on one event loop."""

    def __init__(self, url: str, token: str | None) -> None:
        u = urlsplit(url)
        self.base = url.rstrip("/")
        self.token = token
        self._unix: str | None = None
        self._ssl: ssl.SSLContext | None = None
        if u.scheme == "unix":
            self._unix = u.path
            self.host, self.port, self._prefix = "localhost", 0, ""
            self._host_header = "localhost"
        else:
            if u.scheme == "https":
                self._ssl = ssl.create_default_context()
            self.host = u.hostname or "127.0.0.1"
            self.port = u.port or (443 if u.scheme == "https" else 80)
            self._prefix = u.path.rstrip("/")
            self._host_header = u.netloc.rpartition("@")[2]
        self._pool: list[_Conn] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def url(self, path: str, query: Query | None = None) -> str:
        return self.base + self._target(path, query)

    def _target(self, path: str, query: Query | None) -> str:
        t = self._prefix + path
        if query:
            q = urlencode([(k, item) for k, v in query.items() if v is not None for item in _qv(v)])
            if q:
                t += "?" + q
        return t

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Runs coro in the background, its failure ignored; close() waits for it."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled():
                t.exception()

        task.add_done_callback(done)

    async def close(self) -> None:
        """Waits for background requests (each bounded), then closes the idle connections."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        self._closed = True
        for c in self._pool:
            c.abort()
        self._pool.clear()

    def _idle(self, conn: _Conn) -> None:
        if self._closed or len(self._pool) >= _IDLE or conn.writer.is_closing() or conn.reader.at_eof():
            conn.abort()
            return
        conn.reused = True
        self._pool.append(conn)

    async def _connect(self) -> _Conn:
        try:
            if self._unix is not None:
                r, w = await asyncio.open_unix_connection(self._unix, limit=_MAX_HEAD)
            else:
                r, w = await asyncio.open_connection(
                    self.host, self.port, ssl=self._ssl, limit=_MAX_HEAD,
                    server_hostname=self.host if self._ssl else None)
        except (ConnectionError, OSError) as err:
            raise _Refused(_describe(err)) from err
        return _Conn(r, w)

    def _head(self, method: str, target: str, headers: Mapping[str, str], length: int | None, chunked: bool) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header}"]
        if self.token:
            lines.append(f"Authorization: Bearer {self.token}")
        for k, v in headers.items():
            if "\r" in k or "\n" in k or "\r" in v or "\n" in v:
                raise error("INVALID_ARGUMENT", f"header {k!r}: a line break in a header")
            lines.append(f"{k}: {v}")
        if chunked:
            lines.append("Transfer-Encoding: chunked")
        elif length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _exchange(self, method: str, target: str, headers: Mapping[str, str], body: bytes | AsyncIterable[bytes] | None,
                        length: int | None, idempotent: bool, d: Dispatch, what: str) -> Response:
        """Sends one request and reads its answer's head. An idempotent
        request may go on an idle connection, and on a new one if that one
        turns out closed before answering; any other goes on a new one, so
        that a lost answer is never a request sent twice."""
        while True:
            conn: _Conn | None = None
            if idempotent and self._pool:
                conn = self._pool.pop()
            if conn is None:
                conn = await self._connect()
            try:
                return await self._send(conn, method, target, headers, body, length, d, what)
            except _BrokeOff:
                if conn.reused and idempotent and not isinstance(body, AsyncIterable):
                    continue  # an idle connection the server had closed
                raise
            except BaseException:
                conn.abort()
                raise

    async def _send(self, conn: _Conn, method: str, target: str, headers: Mapping[str, str],
                    body: bytes | AsyncIterable[bytes] | None, length: int | None, d: Dispatch, what: str) -> Response:
        streamed = body is not None and not isinstance(body, bytes)
        if isinstance(body, bytes):
            length = len(body)
        elif body is None and method in ("POST", "PUT", "PATCH"):
            length = 0
        head = self._head(method, target, headers, length, streamed and length is None)
        w = conn.writer
        d.sent = True
        write_error: BaseException | None = None
        try:
            w.write(head)
            if isinstance(body, bytes) and body:
                w.write(body)
            if body is not None and not isinstance(body, bytes):
                await self._stream(w, body, length)
            else:
                await _drain(w)
        except _WriteFailed as err:
            # kilnd may have answered already (a refusal) and closed: its
            # answer, if it came, says more than the broken pipe.
            write_error = err.__cause__ or err
        try:
            while True:
                status_line = await conn.reader.readuntil(b"\r\n")
                parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
                if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                    raise _BrokeOff(f"not an HTTP answer: {status_line[:40]!r}")
                fields = await _read_fields(conn.reader)
                status = int(parts[1])
                if 100 <= status < 200 and status != 101:
                    continue
                if parts[0] == "HTTP/1.0":
                    fields.items.append(("Connection", "close"))
                return Response(self, conn, method, status, parts[2] if len(parts) > 2 else "", fields, what)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError, ValueError) as err:
            if write_error is not None:
                raise _BrokeOff(_describe(write_error)) from write_error
            raise _BrokeOff(_describe(err)) from err

    async def _stream(self, w: asyncio.StreamWriter, body: AsyncIterable[bytes], length: int | None) -> None:
        """Sends a body as its source gives it: its length's worth, or in
        chunks. A source that fails fails the request with its own error."""
        sent = 0
        async for b in body:
            if not b:
                continue
            sent += len(b)
            if length is not None:
                if sent > length:
                    raise error("INVALID_ARGUMENT", f"the body is longer than its {length} bytes")
                w.write(b)
            else:
                w.write(b"%x\r\n" % len(b) + b + b"\r\n")
            await _drain(w)
        if length is not None and sent != length:
            raise error("INVALID_ARGUMENT", f"the body has {sent} bytes, not its {length}")
        if length is None:
            w.write(b"0\r\n\r\n")
        await _drain(w)

    async def fetch(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        json: Any = None,
        body: bytes | AsyncIterable[bytes] | None = None,
        length: int | None = None,
        content_type: str | None = None,
        idempotent: bool = False,
        timeout: float | None = None,
        unbounded: bool = False,
        later: float = 0.0,
        headers: Mapping[str, str] | None = None,
        is_error: Callable[[Response], bool] | None = None,
        dispatch: Dispatch | None = None,
        read: bool | Callable[[Response], bool] = False,
    ) -> Response:
        """Makes one request; returns the answer when its status is below
        300 (or is_error says it is not kilnd's error), with its body read
        into .body when read is set (or says so of the answer), else to be
        read by the caller. A failure after
        dispatch is OUTCOME_UNKNOWN unless the call is idempotent; timeout
        is the caller's (WAIT_ABORTED), the control timeout CONTROL_TIMEOUT
        (and later seconds more, for an answer kilnd gives later by design:
        a stop's grace) unless unbounded."""
        what = f"{method} {path}"
        check_timeout(timeout, what)
        loop = asyncio.get_running_loop()
        now = loop.time()
        caller = None if timeout is None else now + timeout
        bound = CONTROL_TIMEOUT + later
        control = None if unbounded else now + bound
        deadline = caller if control is None else control if caller is None else min(caller, control)
        hdrs = dict(headers or {})
        payload = body
        if json is not None:
            payload = jsonlib.dumps(json, separators=(",", ":")).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif body is not None:
            hdrs.setdefault("Content-Type", content_type or "application/octet-stream")
        d = dispatch or Dispatch()
        target = self._target(path, query)
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                resp = await self._exchange(method, target, hdrs, payload, length, idempotent, d, what)
                try:
                    bad = is_error(resp) if is_error else resp.status >= 300
                    if bad:
                        raw = b""
                        try:
                            raw = await _bounded(resp, _MAX_ERROR_BODY)
                        except SandkilnError:
                            pass
                        raise from_answer(resp.status, _json_or_none(raw), what)
                    if read is True or (callable(read) and read(resp)):
                        resp.body = await resp.read()
                except BaseException:
                    resp.close()
                    raise
                return resp
        except TimeoutError as err:
            if not scope.expired():
                raise
            by_caller = caller is not None and (control is None or caller <= control)
            if by_caller:
                if idempotent or not d.sent:
                    raise error("WAIT_ABORTED", f"{what}: timed out after {timeout} s") from err
                raise error("OUTCOME_UNKNOWN", f"{what}: timed out after {timeout} s with the request sent; "
                            "it may or may not have taken effect") from err
            if not idempotent and d.sent:
                raise error("OUTCOME_UNKNOWN", f"{what}: no answer within {bound:g} s; "
                            "it may or may not have taken effect") from err
            raise error("UNAVAILABLE", f"{what}: kilnd at {self.base} did not answer within {bound:g} s") from err
        except _Refused as err:
            raise error("UNAVAILABLE", f"{what}: kilnd at {self.base} cannot be reached: {err}") from err
        except (_BrokeOff, SandkilnError) as err:
            if isinstance(err, SandkilnError):
                if err.code != "UNAVAILABLE" or err.status is not None:
                    raise
            if not idempotent and d.sent:
                raise error("OUTCOME_UNKNOWN", f"{what}: the answer was lost ({err}); it may or may not have taken effect") from err
            raise error("UNAVAILABLE", f"{what}: kilnd at {self.base} did not answer: {err}") from err

    async def call(self, method: str, path: str, **kw: Any) -> Any:
        """Makes a request and decodes its JSON answer (None for an empty one)."""
        resp = await self.fetch(method, path, read=True, **kw)
        what = f"{method} {path}"
        raw = resp.body
        if not raw:
            return None
        try:
            return jsonlib.loads(raw)
        except ValueError as err:
            raise error("INTERNAL", f"{what}: the answer is not JSON") from err

    async def websocket(self, path: str, query: Query | None, protocol: str, *, timeout: float | None = None) -> WebSocket:
        """Opens a WebSocket speaking protocol. kilnd's refusal is its error,
        as for any request; a connection that fails is UNAVAILABLE."""
        what = f"GET {path}"
        check_timeout(timeout, what)
        key = base64.b64encode(os.urandom(16)).decode()
        headers = {
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": key,
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Protocol": protocol,
        }
        limit = CONTROL_TIMEOUT if timeout is None else min(timeout, CONTROL_TIMEOUT)
        scope = asyncio.timeout(limit)
        try:
            async with scope:
                conn = await self._connect()
                try:
                    resp = await self._send(conn, "GET", self._target(path, query), headers, None, None, Dispatch(), what)
                    if resp.status != 101:
                        raw = b""
                        try:
                            raw = await _bounded(resp, _MAX_ERROR_BODY)
                        except SandkilnError:
                            pass
                        raise from_answer(resp.status, _json_or_none(raw), what)
                    want = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
                    if resp.headers.get("Sec-WebSocket-Accept") != want:
                        raise _BrokeOff("the server's Sec-WebSocket-Accept is not the key's")
                    got = resp.headers.get("Sec-WebSocket-Protocol")
                    if got != protocol:
                        raise _BrokeOff(f"the server speaks {got!r}, not {protocol}")
                    return WebSocket(conn.reader, conn.writer, protocol, _WS_MAX_MESSAGE)
                except BaseException:
                    conn.abort()
                    raise
        except TimeoutError as err:
            if not scope.expired():
                raise
            if timeout is not None and timeout <= CONTROL_TIMEOUT:
                raise error("WAIT_ABORTED", f"{what}: timed out after {timeout} s") from err
            raise error("UNAVAILABLE", f"{what}: kilnd at {self.base} did not answer within {CONTROL_TIMEOUT:g} s") from err
        except (_Refused, _BrokeOff) as err:
            raise error("UNAVAILABLE", f"{what}: the WebSocket did not open: {err}") from err


async def _drain(w: asyncio.StreamWriter) -> None:
    try:
        await w.drain()
    except (ConnectionError, OSError) as err:
        raise _WriteFailed() from err


def check_timeout(timeout: float | None, what: str) -> None:
    """Refuses a timeout that is not a number; one of 0 or less has run out
    before anything began, and nothing is done."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout != timeout:
        raise error("INVALID_ARGUMENT", f"{what}: timeout must be a number of seconds or None, not {timeout!r}")
    if timeout <= 0:
        raise error("WAIT_ABORTED", f"{what}: the timeout ran out before it began")


async def _bounded(resp: Response, limit: int) -> bytes:
    parts: list[bytes] = []
    n = 0
    while n < limit:
        b = await resp.read_some(limit - n)
        if not b:
            break
        parts.append(b)
        n += len(b)
    resp.close()
    return b"".join(parts)


def _json_or_none(raw: bytes) -> Any:
    try:
        return jsonlib.loads(raw)
    except ValueError:
        return None


def _qv(v: str | int | bool | Sequence[str]) -> list[str]:
    """A query parameter's values: a sequence of strings is the
    parameter repeated."""
    if isinstance(v, bool):
        return ["true" if v else "false"]
    if isinstance(v, (str, int)):
        return [str(v)]
    return list(v)


def segment(s: str) -> str:
    """s as one path segment."""
    return quote(s, safe="")
