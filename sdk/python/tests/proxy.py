"""A TCP proxy between the SDK and kilnd that reads each request's first
line: it counts the requests, and for one that matches a rule it can hold
the answer back until released, or cut the connection so that the request
reaches kilnd and its answer never reaches the SDK (a lost
acknowledgement, for real: kilnd did what was asked). Threads, so that it
serves whatever event loop a test runs on."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from dataclasses import dataclass, field
from typing import Pattern

_REQUEST = re.compile(rb"^(GET|HEAD|POST|PUT|DELETE|PATCH|OPTIONS) (\S+) HTTP/1\.1\r\n")


@dataclass
class Rule:
    action: str
    method: str
    path: Pattern[str]
    times: float
    seen: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    proxy: Proxy | None = None

    async def requested(self) -> None:
        """Returns once a matching request came."""
        await _until(self.seen, "the request")

    async def answer(self) -> None:
        """Returns once kilnd answered it."""
        await _until(self.answered, "kilnd's answer")

    def release(self) -> None:
        self.released.set()

    def remove(self) -> None:
        if self.proxy is not None:
            with self.proxy._lock:
                if self in self.proxy._rules:
                    self.proxy._rules.remove(self)


async def _until(e: threading.Event, what: str) -> None:
    if not await asyncio.to_thread(e.wait, 60):
        raise AssertionError(f"{what}: not within 60 s")


@dataclass
class _Conn:
    lines: list[str] = field(default_factory=list)
    from_kilnd: int = 0
    closed: threading.Event = field(default_factory=threading.Event)


class Proxy:
    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self._up = (host, int(port))
        self.requests: list[str] = []
        self._rules: list[Rule] = []
        self._conns: list[_Conn] = []
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._srv.getsockname()[1]}"
        threading.Thread(target=self._accept, name="proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            u = socket.create_connection(self._up)
        except OSError:
            c.close()
            return
        conn = _Conn()
        state: dict[str, Rule | None] = {"rule": None}
        held: list[bytes] = []
        with self._lock:
            self._conns.append(conn)
            self._socks.update((c, u))

        def kill() -> None:
            for s in (c, u):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        def up() -> None:  # the SDK's bytes, to kilnd
            try:
                while True:
                    d = c.recv(65536)
                    if not d:
                        u.shutdown(socket.SHUT_WR)
                        return
                    m = _REQUEST.match(d[:4096])
                    if m:
                        line = f"{m.group(1).decode()} {m.group(2).decode()}"
                        with self._lock:
                            self.requests.append(line)
                            conn.lines.append(line)
                            rule = next((r for r in self._rules if r.method == m.group(1).decode() and r.path.search(m.group(2).decode())), None)
                            if rule is not None:
                                rule.times -= 1
                                if rule.times <= 0:
                                    self._rules.remove(rule)
                        state["rule"] = rule
                        if rule is not None:
                            rule.seen.set()
                    u.sendall(d)
                    r = state["rule"]
                    if r is not None and r.action == "cut-request":
                        kill()
                        return
            except OSError:
                kill()

        def down() -> None:  # kilnd's bytes, to the SDK
            try:
                while True:
                    d = u.recv(65536)
                    if not d:
                        c.shutdown(socket.SHUT_WR)
                        return
                    conn.from_kilnd += len(d)
                    r = state["rule"]
                    if r is not None and r.action == "cut-request":
                        # kilnd answered before the cut: none of it goes on.
                        kill()
                        return
                    if r is not None and r.action == "cut-answer":
                        r.answered.set()
                        kill()
                        return
                    if r is not None and r.action == "hold":
                        held.append(d)
                        r.answered.set()
                        if not held[1:]:
                            # What comes until the release waits with it.
                            threading.Thread(target=flush, args=(r,), daemon=True).start()
                        continue
                    c.sendall(d)
            except OSError:
                kill()

        def flush(r: Rule) -> None:
            r.released.wait()
            try:
                while held:
                    c.sendall(held.pop(0))
            except OSError:
                kill()
            state["rule"] = None

        t = threading.Thread(target=up, daemon=True)
        t.start()
        down()
        t.join()
        for s in (c, u):
            s.close()
        with self._lock:
            self._socks.difference_update((c, u))
        conn.closed.set()

    def _add(self, action: str, method: str, path: str, times: float) -> Rule:
        r = Rule(action, method, re.compile(path), times, proxy=self)
        with self._lock:
            self._rules.append(r)
        return r

    def count(self, method: str, path: str) -> int:
        """How many requests of method had a path matching path (a regular
        expression, matched from the path's start)."""
        p = re.compile(path)
        with self._lock:
            return sum(1 for line in self.requests if line.startswith(method + " ") and p.match(line[len(method) + 1:]))

    def bytes_from(self, path: str) -> int:
        """Bytes kilnd sent on the connections whose first request's path matches."""
        p = re.compile(path)
        with self._lock:
            return sum(c.from_kilnd for c in self._conns if c.lines and p.match(c.lines[0].split(" ")[1]))

    def cut_answer(self, method: str, path: str, times: float = 1) -> Rule:
        """The next matching request reaches kilnd; its answer is cut off."""
        return self._add("cut-answer", method, path, times)

    def cut_request(self, method: str, path: str, times: float = 1) -> Rule:
        """The next matching request reaches kilnd, and its connection is
        cut at once, the answer not yet given."""
        return self._add("cut-request", method, path, times)

    def hold(self, method: str, path: str) -> Rule:
        """The next matching request's answer is held until released."""
        return self._add("hold", method, path, 1)

    def close(self) -> None:
        self._srv.close()
        with self._lock:
            socks = list(self._socks)
            for r in self._rules:
                r.released.set()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class CuttingProxy:
    """A proxy that cuts each connection once kilnd has sent it more than
    limit bytes."""

    def __init__(self, upstream: str, limit: int) -> None:
        self._p = Proxy(upstream)
        self.url = self._p.url
        self._limit = limit
        orig = self._p._serve

        def serve(c: socket.socket) -> None:
            orig(_Limited(c, limit))  # type: ignore[arg-type]

        self._p._serve = serve  # type: ignore[method-assign]

    def close(self) -> None:
        self._p.close()


class _Limited:
    """A socket whose sendall ends the connection once limit bytes went."""

    def __init__(self, s: socket.socket, limit: int) -> None:
        self._s = s
        self._left = limit

    def sendall(self, d: bytes) -> None:
        self._s.sendall(d)
        self._left -= len(d)
        if self._left < 0:
            self._s.shutdown(socket.SHUT_RDWR)
            raise OSError("cut")

    def __getattr__(self, name: str) -> object:
        return getattr(self._s, name)
