"""The SDK's own HTTP/1.1 and WebSocket client, against servers that are
not kilnd: the WebSocket against an independent implementation (the
websockets package's server, a test-only dependency), HTTP against small
servers that answer, break and stall on purpose. All on loopback."""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import websockets.server

import sandkiln
from sandkiln._http import Transport
from sandkiln._process import exit_of
from sandkiln._utf8 import StreamDecoder
from sandkiln._websocket import ConnectionClosed
from checks import rejects


def arun(coro: Awaitable[Any]) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, 60)

    return asyncio.run(bounded())


async def ws_server(handler: Callable[[Any], Awaitable[None]], **kw: Any) -> tuple[Any, str]:
    server = await websockets.server.serve(handler, "127.0.0.1", 0, subprotocols=["kiln.v1"], compression=None, **kw)
    port = next(iter(server.sockets)).getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def test_websocket_messages_both_ways() -> None:
    async def run() -> None:
        got: list[Any] = []

        async def handler(ws: Any) -> None:
            assert ws.subprotocol == "kiln.v1"
            assert ws.request_headers["Authorization"] == "Bearer tok"
            async for m in ws:
                got.append(m)
                if m == "fragments":
                    await ws.send(iter([b"ab", b"cd", b"ef"]))  # one message in three frames
                elif m == "ping":
                    await asyncio.wait_for(await ws.ping(b"are you there"), 10)  # answered, or this fails
                    await ws.send("pong seen")
                elif m == "big":
                    await ws.send(bytes(range(256)) * 4096)
                elif m == "close":
                    await ws.close(4000, "done here")
                else:
                    await ws.send(m)

        server, url = await ws_server(handler)
        try:
            t = Transport(url, "tok")
            ws = await t.websocket("/x", {"q": 1}, "kiln.v1")
            ws.send("héllo")
            assert await ws.recv() == "héllo"
            payload = bytes(range(256)) * 300  # over 64 KiB: an 8-byte length, masked
            ws.send(payload)
            assert await ws.recv() == payload
            ws.send("fragments")
            assert await ws.recv() == b"abcdef"
            ws.send("ping")
            assert await ws.recv() == "pong seen"
            ws.send("big")
            assert await ws.recv() == bytes(range(256)) * 4096
            ws.send("")
            assert await ws.recv() == ""
            ws.send("close")
            with pytest.raises(ConnectionClosed) as c:
                await ws.recv()
            assert (c.value.code, c.value.reason) == (4000, "done here")
            assert ws.closed
        finally:
            server.close()
            await server.wait_closed()
        assert got[0] == "héllo"

    arun(run())


def test_websocket_refused_and_broken() -> None:
    async def run() -> None:
        async def refuse(path: str, headers: Any) -> Any:
            if path.startswith("/missing"):
                body = json.dumps({"error": {"code": "not_found", "message": "no such process"}}).encode()
                return http.HTTPStatus.NOT_FOUND, [("Content-Type", "application/json")], body
            return None

        async def handler(ws: Any) -> None:
            await ws.recv()
            ws.transport.abort()  # gone without a close frame

        server, url = await ws_server(handler, process_request=refuse)
        try:
            t = Transport(url, None)
            # kilnd's refusal is its error, from the handshake's own answer.
            e = await rejects(t.websocket("/missing", None, "kiln.v1"), "NOT_FOUND")
            assert (e.status, e.kiln_code) == (404, "not_found")
            e = await rejects(t.websocket("/x", None, "other.protocol"), "UNAVAILABLE")
            ws = await t.websocket("/x", None, "kiln.v1")
            ws.send("bye")
            with pytest.raises(ConnectionClosed) as c:
                await ws.recv()
            assert c.value.code == 1006
        finally:
            server.close()
            await server.wait_closed()
        await rejects(Transport(url, None).websocket("/x", None, "kiln.v1"), "UNAVAILABLE")

    arun(run())


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def http_server(handler: Handler) -> tuple[asyncio.AbstractServer, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def read_request(r: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    line = (await r.readuntil(b"\r\n")).decode().strip()
    headers = {}
    while (h := (await r.readuntil(b"\r\n")).decode().strip()):
        k, _, v = h.partition(":")
        headers[k.strip().lower()] = v.strip()
    body = b""
    if "content-length" in headers:
        body = await r.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while (n := int((await r.readuntil(b"\r\n")).strip(), 16)):
            body += await r.readexactly(n)
            await r.readexactly(2)
        await r.readexactly(2)
    return line, headers, body


def test_http_bodies_chunked_with_trailers_length_and_close() -> None:
    async def run() -> None:
        seen: list[tuple[str, dict[str, str], bytes]] = []

        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while True:
                try:
                    req = await read_request(r)
                except asyncio.IncompleteReadError:
                    break
                seen.append(req)
                path = req[0].split()[1]
                if path == "/chunked":
                    w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: Kiln-Complete\r\n\r\n"
                            b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nKiln-Complete: true\r\n\r\n")
                elif path == "/json":
                    body = json.dumps({"ok": [1, 2]}).encode()
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                elif path == "/empty":
                    w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                elif path == "/close":
                    w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
                    await w.drain()
                    w.close()
                    return
                await w.drain()
            w.close()

        server, url = await http_server(handler)
        try:
            t = Transport(url, "tok")
            resp = await t.fetch("GET", "/chunked", idempotent=True)
            assert await resp.read() == b"hello world"
            assert resp.trailers.get("kiln-complete") == "true"
            assert await t.call("GET", "/json", idempotent=True) == {"ok": [1, 2]}
            assert await t.call("POST", "/empty", json={"a": "é"}) is None
            resp = await t.fetch("GET", "/close", idempotent=True)
            assert await resp.read() == b"until the end"

            async def gen() -> AsyncIterator[bytes]:
                yield b"streamed "
                yield b"body"

            await t.call("PUT", "/empty", body=gen())
            await t.call("PUT", "/empty", body=gen(), length=13)
            assert seen[2][2] == json.dumps({"a": "é"}, separators=(",", ":")).encode()
            assert seen[4][1].get("transfer-encoding") == "chunked" and seen[4][2] == b"streamed body"
            assert seen[5][1].get("content-length") == "13" and seen[5][2] == b"streamed body"
            assert all(s[1]["authorization"] == "Bearer tok" for s in seen)
            await rejects(t.call("PUT", "/empty", body=gen(), length=5), "INVALID_ARGUMENT")

            async def failing() -> AsyncIterator[bytes]:
                yield b"a first piece"
                raise OSError("the source broke")

            # A body whose source fails fails the request with the source's
            # error, at once: not a wait for an answer to half a request.
            with pytest.raises(OSError, match="the source broke"):
                await t.call("PUT", "/empty", body=failing())
        finally:
            server.close()

    arun(run())


def test_http_what_a_failure_means() -> None:
    async def run() -> None:
        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            line, _, _ = await read_request(r)
            path = line.split()[1]
            if path == "/lost":
                w.close()  # the request arrived; its answer never leaves
            elif path == "/stall":
                await asyncio.sleep(30)
            elif path == "/refuse":
                body = b'{"error": {"code": "failed_precondition", "message": "no"}}'
                w.write(b"HTTP/1.1 412 Precondition Failed\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await w.drain()
                w.close()
            elif path == "/garbage":
                w.write(b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\noops")
                await w.drain()
                w.close()

        server, url = await http_server(handler)
        try:
            t = Transport(url, None)
            # Sent, its answer lost: the outcome of a POST is unknown; a GET is only unavailable.
            await rejects(t.call("POST", "/lost"), "OUTCOME_UNKNOWN")
            await rejects(t.call("GET", "/lost", idempotent=True), "UNAVAILABLE")
            # The caller's timeout: a POST sent (given time to be) is unknown, a GET aborted.
            await rejects(t.call("POST", "/stall", timeout=2), "OUTCOME_UNKNOWN")
            await rejects(t.call("GET", "/stall", idempotent=True, timeout=0.2), "WAIT_ABORTED")
            # Run out before anything began: nothing is sent.
            await rejects(t.call("POST", "/lost", timeout=0), "WAIT_ABORTED")
            e = await rejects(t.call("POST", "/refuse"), "FAILED_PRECONDITION")
            assert (e.status, e.kiln_code, str(e)) == (412, "failed_precondition", "kilnd: no")
            e = await rejects(t.call("GET", "/garbage", idempotent=True), "INTERNAL")
            assert e.status == 500
        finally:
            server.close()
            await server.wait_closed()
        # Nothing listens: never sent, so even a POST is UNAVAILABLE.
        await rejects(Transport(url, None).call("POST", "/x"), "UNAVAILABLE")

    arun(run())


def test_http_idle_connections_are_used_again_and_a_closed_one_is_not_a_failure() -> None:
    async def run() -> None:
        conns: list[int] = []
        closed = asyncio.Event()

        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            conns.append(1)
            n = 0
            while True:
                try:
                    await read_request(r)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                n += 1
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await w.drain()
                if n == 2:
                    w.close()  # an idle timeout, as a server has one
                    await w.wait_closed()
                    closed.set()
                    return

        server, url = await http_server(handler)
        try:
            t = Transport(url, None)
            for _ in range(2):
                assert (await t.fetch("GET", "/", idempotent=True, read=True)).body == b"ok"
            assert len(conns) == 1, "the idle connection was used again"
            await closed.wait()  # the server closed the idle connection
            assert (await t.fetch("GET", "/", idempotent=True, read=True)).body == b"ok"
            assert len(conns) == 2, "the closed one was left for a new one"
            # A request that is not idempotent never goes on an idle connection.
            before = len(conns)
            assert (await t.fetch("POST", "/", read=True)).body == b"ok"
            assert len(conns) == before + 1
            await t.close()
        finally:
            server.close()

    arun(run())


def test_decoder_holds_back_an_incomplete_character() -> None:
    d = StreamDecoder()
    assert (d.decode(b"h\xc3"), d.held) == ("h", 1)
    assert (d.decode(b"\xa9\xe2\x82"), d.held) == ("é", 2)
    assert d.flush() == "\ufffd"
    assert d.held == 0
    assert (d.decode(b"\xff\xe2\x82\xac"), d.held) == ("\ufffd€", 0)


def test_exits_as_the_shell_has_them() -> None:
    assert exit_of({"exit_code": 3}) == sandkiln.Exit(3)
    assert exit_of({"exit_code": 137, "signal": "KILL"}) == sandkiln.Exit(137, "SIGKILL")
    assert exit_of({"signal": "TERM"}) == sandkiln.Exit(143, "SIGTERM")  # an older kilnd's, without a code
    assert exit_of({"exit_code": 137, "signal": "KILL", "oom_killed": True, "output_cut": "drain_timeout"}) == \
        sandkiln.Exit(137, "SIGKILL", True, "drain_timeout")


def test_references_are_the_typescript_sdks_json() -> None:
    # The keys a TypeScript reference has (src/process.ts): either SDK
    # reopens what the other saved.
    assert set(sandkiln.ProcessReference.__annotations__) == {
        "kind", "version", "sandbox", "process", "offsets", "lost", "ended", "stdin", "format", "mode", "maxOutputBytes",
        "overflow", "hold", "expiresAt"}
