"""A sandbox's captured logs: the output of processes started with capture,
kept durably, read back as bytes or as records."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncGenerator, Callable
from datetime import datetime, timezone
from typing import Literal, cast

from ._errors import error
from ._http import Transport, check_timeout, segment
from ._streams import AsyncByteStream, ndjson
from ._types import CapturedLog, LogRecord

Time = datetime | str
"""A time: a datetime (a naive one is local time), an RFC 3339 time, or a
duration back from now ("5m")."""


def _time(t: Time | None) -> str | None:
    if t is None:
        return None
    if isinstance(t, datetime):
        return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(t, str):
        return t
    raise error("INVALID_ARGUMENT", f"logs: a time must be a datetime or a str, not {type(t).__name__}")


class AsyncLogs:
    def __init__(self, t: Transport, path: Callable[[str], str]) -> None:
        self._t = t
        self._path = path

    async def list(self, *, timeout: float | None = None) -> builtins.list[CapturedLog]:
        """The sandbox's captured logs, each with its runs and whether every
        run is lossless."""
        return cast("builtins.list[CapturedLog]", await self._t.call("GET", self._path("/logs"), idempotent=True, timeout=timeout) or [])

    async def read(self, pid: str, *, stream: Literal["stdout", "stderr"] | None = None, tail: int | None = None,
                   since: Time | None = None, until: Time | None = None, follow: bool = False,
                   source: Literal["best", "log"] | None = None, timeout: float | None = None) -> AsyncByteStream:
        """A process's captured output, the bytes as it wrote them (both
        streams as they came, unless stream says one). tail is the last
        lines (0: none, so that with follow only what comes next); follow
        goes on until the process has ended and its log says so; source
        "log" reads the captured log alone. Once it was read to its end, the
        stream's trailers say what the read found of each run: Kiln-Runs
        (JSON), Kiln-Complete, Kiln-Lost."""
        return await self._fetch(pid, stream, tail, since, until, follow, source, "raw", timeout)

    async def records(self, pid: str, *, stream: Literal["stdout", "stderr"] | None = None, tail: int | None = None,
                      since: Time | None = None, until: Time | None = None, follow: bool = False,
                      source: Literal["best", "log"] | None = None, timeout: float | None = None) -> AsyncGenerator[LogRecord, None]:
        """A process's captured output as records (format json): each with
        its stream, offset and time, its content as text (or base64 when it
        is not UTF-8), without the newline that ended it unless partial; a
        record with lost_bytes or gap counts what is not in the log."""
        body = await self._fetch(pid, stream, tail, since, until, follow, source, "json", timeout)
        async for r in ndjson(body, f"records of {pid}"):
            yield cast(LogRecord, r)

    async def _fetch(self, pid: str, stream: str | None, tail: int | None, since: Time | None, until: Time | None,
                     follow: bool, source: str | None, fmt: str, timeout: float | None) -> AsyncByteStream:
        if not isinstance(pid, str) or not pid:
            raise error("INVALID_ARGUMENT", "logs: a process id is needed")
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
            raise error("INVALID_ARGUMENT", f"logs: tail {tail!r}: want a whole number, 0 or more")
        if stream is not None and stream not in ("stdout", "stderr"):
            raise error("INVALID_ARGUMENT", f'logs: stream {stream!r}: want "stdout" or "stderr"')
        check_timeout(timeout, "logs")
        loop = asyncio.get_running_loop()
        start = loop.time()
        resp = await self._t.fetch("GET", self._path(f"/logs/{segment(pid)}"), query={
            "stream": stream, "tail": tail, "since": _time(since), "until": _time(until), "follow": True if follow else None,
            "format": "json" if fmt == "json" else None, "source": source,
        }, idempotent=True, unbounded=True, timeout=timeout)
        left = None if timeout is None else max(timeout - (loop.time() - start), 1e-6)
        return AsyncByteStream(resp, f"logs of {pid}", left)
