"""What the tests share: refusals checked by their code, output read to its
end or to a mark, tasks begun in order."""

from __future__ import annotations

import asyncio
import http.client
import urllib.parse
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from sandkiln import SandkilnError


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


class Fails:
    """``async with fails("CODE")``, or ``with fails("CODE")``: the block must
    raise a SandkilnError of that code; .err is it."""

    def __init__(self, code: str, what: str = "") -> None:
        self.code = code
        self.what = what
        self.err: SandkilnError | None = None

    def __enter__(self) -> Fails:
        return self

    def __exit__(self, typ: type[BaseException] | None, err: BaseException | None, tb: object) -> bool:
        where = f"{self.what}: " if self.what else ""
        if err is None:
            raise AssertionError(f"{where}returned, want {self.code}")
        if not isinstance(err, SandkilnError):
            return False
        assert err.code == self.code, f"{where}{err.code} ({err}), want {self.code}"
        self.err = err
        return True

    async def __aenter__(self) -> Fails:
        return self

    async def __aexit__(self, typ: type[BaseException] | None, err: BaseException | None, tb: object) -> bool:
        return self.__exit__(typ, err, tb)


fails = Fails


async def rejects(aw: Awaitable[Any], code: str, what: str = "") -> SandkilnError:
    with fails(code, what) as f:
        await aw
    assert f.err is not None
    return f.err


@dataclass
class Out:
    stdout: str = ""
    stderr: str = ""
    lost: int = 0
    chunks: list[Any] = field(default_factory=list)


def text_of(c: Any) -> str:
    """A chunk's text: a terminal's bytes, a byte chunk's or a text chunk's."""
    if isinstance(c, bytes):
        return c.decode("utf-8", "replace")
    if hasattr(c, "bytes"):
        return bytes(c.bytes).decode("utf-8", "replace")
    return str(c.text)


async def collect(child: Any, timeout: float | None = None) -> Out:
    """Reads a handle's output to its end."""
    out = Out()
    async for c in child.output(timeout=timeout):
        out.chunks.append(c)
        if c.lost:
            out.lost += c.lost
        elif c.stream == "stdout":
            out.stdout += text_of(c)
        else:
            out.stderr += text_of(c)
    return out


async def read_until(child: Any, want: str) -> str:
    """Reads a handle's output until its text holds want; leaves the loop there."""
    seen = ""
    async for c in child.output():
        seen += text_of(c)
        if want in seen:
            return seen
    return seen


async def read_all(term: Any) -> str:
    s = ""
    async for b in term.output():
        s += b.decode("utf-8", "replace")
    return s


async def begun(*aws: Awaitable[Any]) -> list[asyncio.Task[Any]]:
    """Starts each as a task and lets each run to its first wait, in order:
    one turn of the loop, which runs the tasks made ready before it in the
    order they were made. A write has its place in the input queue then."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    await asyncio.sleep(0)
    return tasks


def preview_get(url: str, path: str = "") -> tuple[int, bytes]:
    """GET of path under a preview's URL, as a browser makes it: a browser
    resolves ID.localhost to loopback itself, where Python's resolver would
    ask DNS; so this connects to loopback on the URL's port and sends the
    preview's own Host. The status and body, whatever the status."""
    u = urllib.parse.urlsplit(url)
    assert u.hostname is not None and u.hostname.endswith(".localhost"), url
    conn = http.client.HTTPConnection("127.0.0.1", u.port or 80, timeout=30)
    try:
        conn.request("GET", u.path + path, headers={"Host": u.netloc})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()
