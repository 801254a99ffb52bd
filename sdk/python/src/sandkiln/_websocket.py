"""The client's end of a WebSocket (RFC 6455) on an asyncio stream, as far as
kilnd needs it: text and binary messages, fragments joined, pings answered,
no extensions. The handshake is _http's."""

from __future__ import annotations

import asyncio
import os
import struct

_CONTINUATION, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA

# Close codes of RFC 6455, section 7.4.1.
NORMAL = 1000
PROTOCOL_ERROR = 1002
NO_STATUS = 1005
ABNORMAL = 1006
INVALID_DATA = 1007
TOO_BIG = 1009


class ConnectionClosed(Exception):
    """The connection closed: by a close frame with its code and reason, or
    without one (1006)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"the WebSocket closed ({code}{': ' + reason if reason else ''})")
        self.code = code
        self.reason = reason


def _mask(key: bytes, data: bytes) -> bytes:
    # One XOR of two big integers: the C loop, not a Python one per byte.
    n = len(data)
    if n == 0:
        return data
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(k, "big")).to_bytes(n, "big")


def frame(opcode: int, payload: bytes) -> bytes:
    """A final, masked frame, as a client sends every frame."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    key = os.urandom(4)
    return head + key + _mask(key, payload)


class WebSocket:
    """One connection. recv() has one caller at a time; send() and close()
    may be called from anywhere on the loop, and never wait: what they write
    is buffered by the transport (drain() waits for it to go)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, protocol: str, max_message: int) -> None:
        self.protocol = protocol
        self._reader = reader
        self._writer = writer
        self._max = max_message
        self._sent_close = False
        self._closed: ConnectionClosed | None = None

    @property
    def closed(self) -> bool:
        return self._closed is not None or self._sent_close

    def send(self, data: str | bytes) -> None:
        """Queues a message; a connection closing drops it (its close says why)."""
        if self.closed or self._writer.is_closing():
            return
        if isinstance(data, str):
            self._writer.write(frame(_TEXT, data.encode()))
        else:
            self._writer.write(frame(_BINARY, data))

    async def drain(self) -> None:
        """Waits until the transport's buffer is low; ConnectionClosed if it broke."""
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as err:
            raise self._lost(f"writing: {err}") from err

    def close(self, code: int = NORMAL, reason: str = "") -> None:
        """Sends a close frame, once, and closes the connection (what is
        buffered goes first). The server's answer is not waited for."""
        if not self._sent_close and not self._writer.is_closing():
            self._sent_close = True
            self._writer.write(frame(_CLOSE, struct.pack("!H", code) + reason.encode()[:123]))
        self._sent_close = True
        self._writer.close()

    def _lost(self, why: str) -> ConnectionClosed:
        if self._closed is None:
            self._closed = ConnectionClosed(ABNORMAL, why)
            self._writer.close()
        return self._closed

    def _fail(self, code: int, why: str) -> ConnectionClosed:
        self.close(code, why)
        self._closed = ConnectionClosed(code, why)
        return self._closed

    async def _read(self, n: int) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError as err:
            raise self._lost("the connection ended without a close frame") from err
        except (ConnectionError, OSError) as err:
            raise self._lost(f"reading: {err}") from err

    async def recv(self) -> str | bytes:
        """The next message: str for a text message, bytes for a binary one.
        ConnectionClosed once the connection is closed, by either end."""
        if self._closed is not None:
            raise self._closed
        parts: list[bytes] = []
        kind: int | None = None
        size = 0
        while True:
            b0, b1 = await self._read(2)
            fin, op, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
            if b0 & 0x70:
                raise self._fail(PROTOCOL_ERROR, "a frame with reserved bits, and no extension agreed")
            if b1 & 0x80:
                raise self._fail(PROTOCOL_ERROR, "a masked frame from the server")
            if n == 126:
                (n,) = struct.unpack("!H", await self._read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", await self._read(8))
            if op >= 0x8:
                if not fin or n > 125:
                    raise self._fail(PROTOCOL_ERROR, "a fragmented or long control frame")
                payload = await self._read(n)
                if op == _PING:
                    if not self.closed:
                        self._writer.write(frame(_PONG, payload))
                elif op == _CLOSE:
                    code, reason = NO_STATUS, ""
                    if len(payload) >= 2:
                        (code,) = struct.unpack("!H", payload[:2])
                        reason = payload[2:].decode("utf-8", "replace")
                    self.close(code if code != NO_STATUS else NORMAL)
                    self._closed = ConnectionClosed(code, reason)
                    raise self._closed
                elif op != _PONG:
                    raise self._fail(PROTOCOL_ERROR, f"opcode {op}")
                continue
            if op == _CONTINUATION:
                if kind is None:
                    raise self._fail(PROTOCOL_ERROR, "a continuation frame outside a message")
            elif op in (_TEXT, _BINARY):
                if kind is not None:
                    raise self._fail(PROTOCOL_ERROR, "a message begun inside another")
                kind = op
            else:
                raise self._fail(PROTOCOL_ERROR, f"opcode {op}")
            size += n
            if size > self._max:
                raise self._fail(TOO_BIG, f"a message over {self._max} bytes")
            parts.append(await self._read(n))
            if fin:
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                if kind == _BINARY:
                    return data
                try:
                    return data.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise self._fail(INVALID_DATA, "a text message that is not UTF-8") from err
