"""The streaming contract, one case per sentence of the seed ("Streaming and
interactive processes") that states behaviour, each named by its sentence:
the TypeScript SDK's conformance suite (sdk/typescript/test/contract/),
case for case, in Python's spelling. The seed says { signal } where Python
says timeout= (or cancels a task), Uint8Array where Python has bytes,
closeStdin where Python has close_stdin.

A case gets t (Case): an AsyncClient and the shared sandbox, the same
sandbox reached through the proxy (t.via), the proxy, and kilnd. Where
sandkiln does better than the seed on purpose, the case asserts the better
behaviour and says how in its deviation."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
import re
import string
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import sandkiln
from sandkiln import LIMITS, ByteChunk, ProcessLine, ProcessTail, SandkilnError, TailSnapshot, TextChunk, read_process_lines

from checks import begun, collect, fails, read_all, read_until, rejects, sh
from kilnd import Kilnd
from proxy import Proxy


CAT = ["cat"]
STREAM: Any = {"mode": "stream"}


@dataclass
class Case:
    section: str
    sentence: str
    run: Callable[[T], Awaitable[None]]
    needs: str | None = None
    deviation: str | None = None


@dataclass
class T:
    client: sandkiln.AsyncClient
    sandbox: sandkiln.AsyncSandbox
    via: sandkiln.AsyncSandbox
    proxy: Proxy
    kilnd: Kilnd


CASES: list[Case] = []


def case(section: str, sentence: str, needs: str | None = None, deviation: str | None = None) -> Callable[[Callable[[T], Awaitable[None]]], Callable[[T], Awaitable[None]]]:
    def add(f: Callable[[T], Awaitable[None]]) -> Callable[[T], Awaitable[None]]:
        CASES.append(Case(section, sentence, f, needs, deviation))
        return f

    return add


async def record(t: T, child: Any) -> dict[str, Any]:
    """kilnd's own account of a process, asked directly."""
    r: dict[str, Any] = await t.sandbox.transport.call("GET", f"/sandboxes/{t.sandbox.id}/exec-stream/{child.id}")
    return r


async def kill(t: T, pid: str) -> None:
    """Ends a process behind the handles' back, as another client would."""
    await t.sandbox.transport.call("DELETE", f"/sandboxes/{t.sandbox.id}/exec-stream/{pid}")


async def until(t: T, child: Any, pred: Callable[[dict[str, Any]], bool], what: str) -> None:
    """Asks kilnd about a process until pred holds (a bounded poll of real state)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if pred(await record(t, child)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what}: not within 30 s")


def process_path(t: T, child: Any, rest: str = "") -> str:
    return f"^/sandboxes/{t.sandbox.id}/exec-stream/{child.id}{re.escape(rest)}(\\?|$)"


def start_path(t: T) -> str:
    return f"^/sandboxes/{t.sandbox.id}/exec-stream$"


def chunk(stream: str, text: str) -> TextChunk:
    """A chunk as read_process_lines and ProcessTail take it."""
    return TextChunk(stream, text, 0, 0, 0)  # type: ignore[arg-type]


def marker(prefix: str) -> str:
    return prefix + "-" + "".join(random.choices(string.ascii_lowercase + string.digits, k=10))


@dataclass
class Burst:
    got: bytes
    want: str
    sum: str
    error: BaseException | None
    result: sandkiln.WaitResult | None


async def burst(t: T, n: int, read: Callable[[ByteChunk, int], Awaitable[None]] | None = None) -> Burst:
    """A burst of n random bytes on stdout, written as fast as the program
    can, its SHA-256 first on stderr; says whether what came matched."""
    child = await t.sandbox.processes.start(
        sh(f"head -c {n} /dev/urandom > /tmp/burst.$$ && sha256sum < /tmp/burst.$$ >&2 && cat /tmp/burst.$$; rm -f /tmp/burst.$$"),
        output={"mode": "stream", "format": "bytes"})
    parts: list[bytes] = []
    size = 0
    err = b""
    error: BaseException | None = None
    try:
        async for c in child.output():
            if c.stream == "stdout":
                if read is not None:
                    await read(c, size)
                parts.append(c.bytes)
                size += len(c.bytes)
            else:
                err += c.bytes
    except SandkilnError as e:
        error = e
    got = b"".join(parts)
    result = None if error else await child.wait()
    await child.detach()
    return Burst(got, err.decode().split(" ")[0], hashlib.sha256(got).hexdigest(), error, result)


# The seed's example, as written.


@case("processes.start", "The example reads output while sending requests, closes stdin when there is no more input, and waits for both output and exit.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(["sh", "-c", 'while read l; do echo "done: $l"; done'], stdin="pipe", output={"mode": "stream"})
    seen: list[str] = []

    async def output() -> None:
        async for chunk in child.output():
            assert chunk.stream == "stdout"
            seen.append(chunk.text)

    completion = asyncio.gather(output(), child.wait(), return_exceptions=True)
    try:
        await child.write("first request\n")
        await child.write("second request\n".encode())
        await child.close_stdin()
        status = await child.status()
        done = await completion
    finally:
        await child.detach()
    assert status.state in ("running", "exited"), status.state
    assert not isinstance(done[0], BaseException), done[0]
    assert not isinstance(done[1], BaseException), done[1]
    assert done[1].exit_code == 0
    assert "".join(seen) == "done: first request\ndone: second request\n"


@case("processes.start", "Output defaults to UTF-8 text, with separate stdout and stderr.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("printf 'h\\303\\251 '; printf x >&2; printf '\\342\\202'; printf '\\254\\n'"), output=STREAM)
    out = await collect(child)
    assert out.stdout == "hé €\n"
    assert out.stderr == "x"
    assert all(isinstance(c, TextChunk) for c in out.chunks)
    await child.detach()


@case("processes.start", "Beachside keeps a small queue of unread output, so read it as it arrives.")
async def _(t: T) -> None:
    # The queue's bounds, as the SDK states them: 64 KiB and 256 chunks.
    assert LIMITS.max_queued_bytes == 64 << 10
    assert LIMITS.max_queued_chunks == 256
    assert LIMITS.max_chunk_bytes == 16 << 10
    child = await t.sandbox.processes.start(sh("seq 1 20000"), output=STREAM)
    lines = 0
    async for c in child.output():
        lines += c.text.count("\n")
    assert lines == 20000
    await child.detach()


# Sending input.


@case("input", 'Set stdin: "pipe" to call write() and closeStdin().')
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(CAT, stdin="pipe", output=STREAM)
    (out,) = await begun(collect(child))
    await child.write("piped\n")
    await child.close_stdin()
    assert (await out).stdout == "piped\n"
    assert (await child.wait()).exit_code == 0
    await child.detach()


@case("input", 'The default, "closed", does not accept input.')
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("read x; echo got:$x"), output=STREAM)
    await rejects(child.write("x\n"), "STDIN_CLOSED")
    await rejects(child.close_stdin(), "STDIN_CLOSED")
    # The program's stdin is closed: read meets its end at once.
    assert (await collect(child)).stdout == "got:\n"
    await child.detach()


@case("input", "Strings are encoded as UTF-8; Uint8Array values preserve exact bytes, including NUL and invalid UTF-8.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("od -An -tx1 -v"), stdin="pipe", output=STREAM)
    (out,) = await begun(collect(child))
    await child.write("é")
    await child.write(bytes([0x00, 0xFF, 0xC3, 0x41]))
    await child.close_stdin()
    assert (await out).stdout.split() == ["c3", "a9", "00", "ff", "c3", "41"]
    await child.detach()


@case("input", "Each write can contain at most 64 KiB.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("wc -c"), stdin="pipe", output=STREAM)
    (out,) = await begun(collect(child))
    await child.write(bytes(64 << 10))
    await rejects(child.write(bytes((64 << 10) + 1)), "INVALID_ARGUMENT")
    await child.close_stdin()
    assert (await out).stdout.strip() == str(64 << 10)
    await child.detach()


@case("input", "The input queue holds at most 256 KiB, including the write in progress, and at most 256 calls.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("wc -c"), stdin="pipe", output=STREAM)
    (out,) = await begun(collect(child))
    # 256 calls are taken; the 257th, while they wait, is refused.
    calls = await begun(*(child.write("x") for _ in range(256)))
    await rejects(child.write("x"), "INPUT_CAPACITY")
    await asyncio.gather(*calls)
    # Four writes of 64 KiB fill the bytes; one byte more is refused.
    big = await begun(*(child.write(bytes(64 << 10)) for _ in range(4)))
    await rejects(child.write("y"), "INPUT_CAPACITY")
    await asyncio.gather(*big)
    await child.close_stdin()
    assert (await out).stdout.strip() == str(256 + (256 << 10))
    await child.detach()


@case("input", "Beachside copies accepted bytes and sends writes in order.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(CAT, stdin="pipe", output=STREAM)
    (out,) = await begun(collect(child))
    buf = bytearray(b"abc\n")
    writes = await begun(child.write(buf), child.write("def\n"), child.write(b"ghi\n"))
    buf[:3] = b"XYZ"  # changed once the write began: it took a copy
    await asyncio.gather(*writes)
    await child.close_stdin()
    assert (await out).stdout == "abc\ndef\nghi\n"
    await child.detach()


@case("input", "An empty write checks that input is still allowed but does not close stdin.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(CAT, stdin="pipe", output=STREAM)
    (out,) = await begun(collect(child))
    await child.write("")
    await child.write("still open\n")
    await child.close_stdin()
    await rejects(child.write(""), "STDIN_CLOSED")
    assert (await out).stdout == "still open\n"
    await child.detach()


@case("input", "closeStdin() sends end-of-input (EOF) after earlier writes;")
async def _(t: T) -> None:
    # 1,000 writes not awaited one by one, in four groups within the
    # queue's 256 calls, the close begun right after the last group's:
    # every line reaches cat, then its end.
    child = await t.sandbox.processes.start(CAT, stdin="pipe", output=STREAM)
    (out,) = await begun(collect(child))
    want = ""
    for g in range(4):
        lines = [f"line {g * 250 + i}\n" for i in range(250)]
        want += "".join(lines)
        group = [child.write(line) for line in lines]
        if g == 3:
            group.append(child.close_stdin())
        await asyncio.gather(*await begun(*group))
    assert (await out).stdout == want
    assert (await child.wait()).exit_code == 0
    await child.detach()


@case("input", "repeated successful closes do not send EOF again.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(CAT, stdin="pipe", output=STREAM)
    await child.close_stdin()
    await child.close_stdin()
    await asyncio.gather(child.close_stdin(), child.close_stdin())
    assert t.proxy.count("POST", process_path(t, child, "/stdin/close")) == 1
    assert (await child.wait()).exit_code == 0
    await child.detach()


@case("input", "Later writes reject locally.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(CAT, stdin="pipe", output=STREAM)
    await child.close_stdin()
    await rejects(child.write("late\n"), "STDIN_CLOSED")
    assert t.proxy.count("POST", process_path(t, child, "/stdin")) == 0, "a write went to kilnd"
    await child.detach()


@case("input", "A successful write means the transport accepted it, not that the program read it.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("sleep 30"), stdin="pipe", output=STREAM)
    await child.write("never read\n")
    r = await record(t, child)
    assert r["stdin"]["accepted"] == len("never read\n")
    await child.terminate()
    await child.wait()
    await child.detach()


@case("input", "Cancelling a queued write before it is sent has no remote effect.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(CAT, stdin="pipe", output=STREAM)
    held = t.proxy.hold("POST", process_path(t, child, "/stdin"))
    (first,) = await begun(child.write("first\n"))
    await held.requested()
    # One queued write's timeout runs out, another's task is cancelled:
    # neither is sent.
    await rejects(child.write("timed out\n", timeout=0.2), "WAIT_ABORTED")
    (queued,) = await begun(child.write("cancelled\n"))
    queued.cancel()
    try:
        await queued
        raise AssertionError("the cancelled write returned")
    except asyncio.CancelledError:
        pass
    held.release()
    await first
    await child.write("third\n")
    await child.close_stdin()
    assert (await collect(child)).stdout == "first\nthird\n"
    assert t.proxy.count("POST", process_path(t, child, "/stdin")) == 2
    await child.detach()


@case("input", "If a sent write or EOF is not acknowledged, delivery is unknown and further input is disabled.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(CAT, stdin="pipe", output=STREAM)
    cut = t.proxy.cut_answer("POST", process_path(t, child, "/stdin"))
    await rejects(child.write("lost answer\n"), "OUTCOME_UNKNOWN")
    await cut.answer()
    await rejects(child.write("more\n"), "INPUT_UNCERTAIN")
    await rejects(child.close_stdin(), "INPUT_UNCERTAIN")
    with fails("INPUT_UNCERTAIN"):
        child.reference()
    # kilnd did take it.
    assert (await record(t, child))["stdin"]["accepted"] == len("lost answer\n")
    await child.terminate()
    await child.detach()


@case("input", "Beachside never retries that input.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(CAT, stdin="pipe", output=STREAM)
    cut = t.proxy.cut_answer("POST", process_path(t, child, "/stdin/close"))
    await rejects(child.close_stdin(), "OUTCOME_UNKNOWN")
    await cut.answer()
    await rejects(child.close_stdin(), "INPUT_UNCERTAIN")
    assert t.proxy.count("POST", process_path(t, child, "/stdin/close")) == 1
    assert (await child.wait()).exit_code == 0  # the EOF did arrive
    await child.detach()


@case("input", "You can still read output, check status, wait or terminate where the connection allows.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(CAT, stdin="pipe", output=STREAM)
    cut = t.proxy.cut_answer("POST", process_path(t, child, "/stdin"))
    await rejects(child.write("echoed\n"), "OUTCOME_UNKNOWN")
    await cut.answer()
    assert await read_until(child, "echoed\n") == "echoed\n"
    assert (await child.status()).state == "running"
    assert await child.terminate() == sandkiln.TerminateResult("requested")
    assert (await child.wait()).signal == "SIGKILL"
    await child.detach()


@case("input", "Each dispatched input request, status check and termination request has a 30-second local timeout; "
      "that timeout does not limit the process's runtime or the sandbox's lifetime.", needs="slow")
async def _(t: T) -> None:
    child = await t.via.processes.start(CAT, stdin="pipe", output=STREAM)
    sleeper = await t.via.processes.start(sh("sleep 300"), output=STREAM)
    holds = [
        t.proxy.hold("POST", process_path(t, child, "/stdin")),
        t.proxy.hold("GET", process_path(t, sleeper)),
        t.proxy.hold("DELETE", process_path(t, sleeper)),
    ]

    async def timed(aw: Awaitable[Any]) -> tuple[Any, BaseException | None, float]:
        t0 = time.monotonic()
        try:
            v = await aw
            return v, None, time.monotonic() - t0
        except SandkilnError as e:
            return None, e, time.monotonic() - t0

    write, status, terminate = await asyncio.gather(timed(child.write("held\n")), timed(sleeper.status()), timed(sleeper.terminate()))
    # The bound's length is the contract: not before 30 s, and not long after.
    for what, r in (("write", write), ("status", status), ("terminate", terminate)):
        assert 29.9 <= r[2] < 45, f"{what} gave up after {r[2]:.1f} s"
    assert isinstance(write[1], SandkilnError) and write[1].code == "OUTCOME_UNKNOWN", write
    assert status[0].state == "unknown", status
    assert isinstance(terminate[1], SandkilnError) and terminate[1].code == "OUTCOME_UNKNOWN", terminate
    for h in holds:
        await h.answer()
    # The process ran on; the sandbox is there.
    assert (await record(t, child))["state"] == "running"
    assert (await t.sandbox.refresh())["state"] == "running"
    await kill(t, child.id)
    await child.detach()
    await sleeper.detach()


# Reading output.


@case("output", "Each process has one output consumer.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("read x; echo $x"), stdin="pipe", output=STREAM)
    (first,) = await begun(collect(child))
    await rejects(collect(child), "OUTPUT_IN_USE")
    await child.write("one\n")
    assert (await first).stdout == "one\n"
    await child.detach()


@case("output", "In stream mode, leaving the output loop stops reading output but leaves input and process control available.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(CAT, stdin="pipe", output=STREAM)
    await child.write("a\n")
    assert await read_until(child, "a\n") == "a\n"
    await child.write("b\n")  # input still available
    assert (await child.status()).state == "running"
    assert await read_until(child, "b\n") == "b\n"  # output again, from where it stood
    await child.close_stdin()
    assert (await child.wait()).exit_code == 0
    await child.detach()


@case("output", "In the default finite mode, leaving the loop detaches the whole local handle.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("echo one; sleep 30"), stdin="pipe")
    assert await read_until(child, "one\n") == "one\n"
    await rejects(child.write("x"), "DETACHED")
    await rejects(child.status(), "DETACHED")
    await rejects(child.wait(), "DETACHED")
    assert (await record(t, child))["state"] == "running", "leaving the loop killed the process"
    await kill(t, child.id)


@case("output", "The unread SDK queue holds at most 64 KiB and 256 chunks.", needs="proxy")
async def _(t: T) -> None:
    # A consumer that stops after its first chunk: kilnd sends no more than
    # the queue holds (its credit), so the bytes that crossed the proxy stay
    # within a queue's worth, however much the process wrote.
    total = 8 << 20
    child = await t.via.processes.start(sh(f"head -c {total} /dev/zero"), output={"mode": "stream", "format": "bytes"})
    it = child.output()
    first = await anext(it)
    assert len(first.bytes) <= LIMITS.max_chunk_bytes
    await until(t, child, lambda r: bool(r.get("held")), "the process waiting for its reader")
    # What crossed: the chunk delivered, a queue's worth unread, as much
    # again held apart until the queue has room, and the frames' headers.
    crossed = t.proxy.bytes_from(process_path(t, child, "/logs"))
    assert crossed <= len(first.bytes) + 2 * LIMITS.max_queued_bytes + 4096, f"{crossed} bytes crossed while the consumer read one chunk"
    got = len(first.bytes)
    async for c in it:
        assert len(c.bytes) <= LIMITS.max_chunk_bytes
        got += len(c.bytes)
    assert got == total
    await child.detach()


@case("output", "Each delivered chunk is at most 16 KiB.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("head -c 3000000 /dev/zero | tr '\\0' x"), output=STREAM)
    n = 0
    async for c in child.output():
        assert len(c.text.encode()) <= LIMITS.max_chunk_bytes, f"a chunk of {len(c.text.encode())} bytes"
        n += len(c.text)
    assert n == 3000000
    await child.detach()


@case("output", "Stream mode has no total output limit over the process's lifetime.")
async def _(t: T) -> None:
    # 32 MiB written as fast as the program can, read by a loop that does
    # nothing else: every byte, by SHA-256.
    r = await burst(t, 32 << 20)
    assert r.error is None, r.error
    assert len(r.got) == 32 << 20
    assert r.sum == r.want, "SHA-256 of what came"
    assert r.result is not None and r.result.output_complete


@case("output", "If your consumer falls behind and fills the queue, output fails with OUTPUT_CAPACITY.",
      deviation="A process its handle started waits for the handle's reader instead (as a program waits for its terminal), "
      "so a consumer that falls behind loses nothing; OUTPUT_CAPACITY is for bytes really lost, as below.")
async def _(t: T) -> None:
    # A reader that stops for 5 s during a 64 MiB burst: every byte, or
    # OUTPUT_CAPACITY; never a short transcript without an error.
    paused = []

    async def read(c: ByteChunk, at: int) -> None:
        if not paused and at >= 1 << 20:
            paused.append(at)
            await asyncio.sleep(5)  # the slow reader itself, not a wait for something

    r = await burst(t, 64 << 20, read)
    if r.error is not None:
        assert isinstance(r.error, SandkilnError) and r.error.code == "OUTPUT_CAPACITY", r.error
    else:
        assert len(r.got) == 64 << 20
        assert r.sum == r.want, "SHA-256 of what came"
    assert paused


@case("output", "Beachside stops local output observation without silently dropping chunks or killing the process.")
async def _(t: T) -> None:
    # A process that does not wait for its reader (flow "drop") and a reader
    # that stalls until 4 MiB (four times what kilnd keeps) were written:
    # what came is contiguous from 0, then OUTPUT_CAPACITY with the count,
    # and the process runs on.
    total = 4 << 20
    child = await t.sandbox.processes.start(sh(f"head -c {total} /dev/zero; read x; echo got-$x"), stdin="pipe",
                                            output={"mode": "stream", "format": "bytes", "flow": "drop"})
    it = child.output()
    got = 0
    with fails("OUTPUT_CAPACITY") as f:
        first = await anext(it)
        got = len(first.bytes)
        await until(t, child, lambda r: r["streams"]["stdout"]["total_bytes"] == total, "all of the output written")
        async for c in it:
            assert c.offset == got, "a chunk skipped"
            got += len(c.bytes)
    assert re.search(r"\d+ bytes of stdout were lost", str(f.err)), f.err
    assert got < total
    assert (await record(t, child))["state"] == "running"
    await child.write("on\n")
    w = await child.wait()
    assert w.exit_code == 0
    assert not w.output_complete
    assert w.streams["stdout"].lost_bytes > 0
    await child.detach()


@case("output", "A native transport can allocate one bounded incoming frame before the SDK checks its queue.", needs="proxy")
async def _(t: T) -> None:
    # The bound is the credit: kilnd sends no frame past it, so the queue is
    # never over, whatever arrives at once.
    child = await t.via.processes.start(sh("head -c 2000000 /dev/zero"), output={"mode": "stream", "format": "bytes"})
    it = child.output()
    first = await anext(it)
    await until(t, child, lambda r: bool(r.get("held")), "the process waiting for its reader")
    assert t.proxy.bytes_from(process_path(t, child, "/logs")) <= len(first.bytes) + 2 * LIMITS.max_queued_bytes + 4096
    await it.aclose()
    await child.detach()


# Byte output.


@case("bytes", 'Set output: { mode: "stream", format: "bytes" } when starting the process. child.output() then yields '
      "{ stream, bytes: Uint8Array } from the native pipe, preserving NUL and invalid UTF-8.")
async def _(t: T) -> None:
    # 256 KiB of every byte value on stdout; invalid UTF-8 and NUL on stderr.
    child = await t.sandbox.processes.start(
        sh("d=$(mktemp -d); printf \"$(printf '\\\\%03o' $(seq 0 255) | tr -d ' ')\" > $d/p; "
           "for i in 1 2 3 4 5 6 7 8 9 10; do cat $d/p $d/p > $d/q; mv $d/q $d/p; done; cat $d/p; rm -r $d; printf '\\000\\377\\300' >&2"),
        output={"mode": "stream", "format": "bytes"})
    parts: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    async for c in child.output():
        assert isinstance(c, ByteChunk) and isinstance(c.bytes, bytes)
        parts[c.stream].append(c.bytes)
    out = b"".join(parts["stdout"])
    assert out == bytes(range(256)) * 1024
    assert b"".join(parts["stderr"]) == bytes([0, 0xFF, 0xC0])
    await child.detach()


@case("bytes", "Each chunk owns its bytes.")
async def _(t: T) -> None:
    # Python's bytes cannot be changed: each chunk's are its own object, not
    # a view of a buffer the SDK reuses, and stay as they came while later
    # chunks arrive.
    child = await t.sandbox.processes.start(sh("head -c 100000 /dev/zero | tr '\\0' a"), output={"mode": "stream", "format": "bytes"})
    kept: list[bytes] = []
    async for c in child.output():
        assert type(c.bytes) is bytes
        kept.append(c.bytes)
    assert all(b == b"a" * len(b) for b in kept)
    assert sum(map(len, kept)) == 100000
    await child.detach()


@case("bytes", "A chunk can end in the middle of a character or application record; process chunks incrementally or use a streaming decoder.")
async def _(t: T) -> None:
    # Text mode decodes across chunk boundaries: 20,000 € (3 bytes each)
    # come back whole whatever the cuts.
    child = await t.sandbox.processes.start(sh("i=0; while [ $i -lt 20 ]; do head -c 1000 /dev/zero | sed 's/\\x00/€/g'; i=$((i+1)); done"), output=STREAM)
    assert (await collect(child)).stdout == "€" * 20000
    await child.detach()


@case("bytes", "Each byte chunk is at most 16 KiB, with at most 64 KiB unread.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("head -c 1000000 /dev/urandom"), output={"mode": "stream", "format": "bytes"})
    n = 0
    async for c in child.output():
        assert len(c.bytes) <= 16 << 10
        n += len(c.bytes)
    assert n == 1000000
    await child.detach()


# Waiting for exit.


@case("waiting", "wait({ signal }) waits for a confirmed exit and returns an exit code, including nonzero codes.")
async def _(t: T) -> None:
    for code in (0, 1, 42, 255):
        child = await t.sandbox.processes.start(sh(f"exit {code}"), output=STREAM)
        r = await child.wait(timeout=30)
        assert r.exit_code == code
        assert r.signal is None
        await child.detach()
    # A signal's exit has a code too: 128 plus its number, beside its name.
    killed = await t.sandbox.processes.start(sh("kill -KILL $$"), output=STREAM)
    r = await killed.wait()
    assert (r.exit_code, r.signal) == (137, "SIGKILL")
    await killed.detach()


@case("waiting", "It has no default timeout; supply an abort signal to limit your wait.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("sleep 30"), output=STREAM)
    await rejects(child.wait(timeout=0.2), "WAIT_ABORTED")
    assert (await child.status()).state == "running"
    await child.terminate()
    assert (await child.wait()).signal == "SIGKILL"
    await child.detach()


@case("waiting", "Aborting cancels only that waiter.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("read x; exit 3"), stdin="pipe", output=STREAM)
    cancelled, timed_out, other = await begun(child.wait(), child.wait(timeout=0.2), child.wait())
    cancelled.cancel()
    try:
        await cancelled
        raise AssertionError("the cancelled wait returned")
    except asyncio.CancelledError:
        pass
    await rejects(timed_out, "WAIT_ABORTED")
    await child.write("\n")
    assert (await other).exit_code == 3
    await child.detach()


@case("waiting", "The result's outputComplete is true only after the output stream has ended and all queued output has been delivered without a gap.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("echo a; echo b >&2"), output=STREAM)
    out = await collect(child)
    assert out.stdout + out.stderr == "a\nb\n"
    r = await child.wait()
    assert r.output_complete
    assert r.streams["stdout"] == sandkiln.StreamCount(bytes=2, lost_bytes=0, ended=True)
    await child.detach()


@case("waiting", "A wait that finishes before output drains can return false; a later wait can return true.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("echo done"), output=STREAM)
    early = await child.wait()  # nothing read yet
    assert not early.output_complete
    await collect(child)
    assert (await child.wait()).output_complete
    await child.detach()


@case("waiting", "Earlier results do not change.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("echo x; exit 4"), output=STREAM)
    early = await child.wait()
    copy = dataclasses.asdict(early)
    await collect(child)
    later = await child.wait()
    assert later.output_complete
    assert dataclasses.asdict(early) == copy
    await child.detach()


@case("waiting", "An output error does not erase a confirmed exit.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("head -c 4194304 /dev/zero; exit 5"), output={"mode": "stream", "format": "bytes", "flow": "drop"})
    exit = await child.wait()
    assert exit.exit_code == 5
    await rejects(collect(child), "OUTPUT_CAPACITY")
    after = await child.wait()
    assert (after.exit_code, after.signal, after.output_complete) == (5, None, False)
    st = await child.status()
    assert st.exit is not None and st.exit.exit_code == 5
    await child.detach()


@case("waiting", "If a broken connection also prevents exit observation, the wait fails as unavailable instead of guessing an exit code.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(sh("sleep 30"), output=STREAM)
    cut = t.proxy.cut_request("GET", process_path(t, child, "/wait"), float("inf"))
    await rejects(child.wait(), "UNAVAILABLE")
    cut.remove()
    assert (await child.status()).state == "running"
    await child.terminate()
    assert (await child.wait()).signal == "SIGKILL"
    await child.detach()


# Checking status.


@case("status", 'status({ signal }) returns { state: "running" | "exited" | "unknown", exit?, observedAt } without downloading a transcript.', needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(sh("head -c 1000000 /dev/zero; read x"), stdin="pipe", output=STREAM)
    st = await child.status(timeout=10)
    assert st.state == "running"
    assert st.exit is None
    assert isinstance(st.observed_at, datetime)
    assert t.proxy.count("GET", process_path(t, child, "/logs")) == 0, "status downloaded output"
    await child.write("\n")
    await child.wait()
    done = await child.status()
    assert done.state == "exited"
    assert done.exit is not None and done.exit.exit_code == 0
    await child.detach()


@case("status", "Unknown means there is not enough evidence to say whether the process is running. Having a local handle alone does not prove it is running.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(sh("sleep 30"), output=STREAM)
    cut = t.proxy.cut_request("GET", process_path(t, child), float("inf"))
    st = await child.status()
    cut.remove()
    assert st.state == "unknown"
    assert st.error is not None and st.error.code == "UNAVAILABLE"
    assert st.exit is None
    await child.terminate()
    await child.wait()
    await child.detach()


@case("status", "A confirmed exit is preserved.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(sh("exit 6"), output=STREAM)
    await child.wait()
    cut = t.proxy.cut_request("GET", process_path(t, child), float("inf"))
    st = await child.status()
    cut.remove()
    assert st.state == "exited"
    assert st.exit is not None and st.exit.exit_code == 6
    await child.detach()


# Stopping and cleaning up.


@case("termination", 'terminate({ signal }) returns { status: "requested" | "not-found" | "exited" }.')
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("sleep 30"), output=STREAM)
    assert await child.terminate(timeout=10) == sandkiln.TerminateResult("requested")
    await child.wait()
    assert await child.terminate() == sandkiln.TerminateResult("exited")
    await child.detach()
    # A process kilnd no longer has (a tombstone evicted, or never there).
    ghost = await t.sandbox.processes.get(child.id)
    try:
        await kill(t, child.id)
    except SandkilnError:
        pass
    assert (await ghost.terminate()).status in ("exited", "not-found")
    await ghost.detach()


@case("termination", "A successful request does not prove the process has exited: call wait() separately.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("sleep 30"), output=STREAM)
    r = await child.terminate()
    assert r.status == "requested"
    w = await child.wait()
    assert w.signal == "SIGKILL"
    await child.detach()


@case("termination", "Concurrent callers share one termination request, and cancelling one caller stops only its wait.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(sh("sleep 30"), output=STREAM)
    held = t.proxy.hold("DELETE", process_path(t, child))
    (a,) = await begun(child.terminate())
    await held.requested()
    b, c = await begun(child.terminate(), child.terminate(timeout=0.2))
    a.cancel()
    try:
        await a
        raise AssertionError("the cancelled terminate returned")
    except asyncio.CancelledError:
        pass
    await rejects(c, "WAIT_ABORTED")
    held.release()
    assert await b == sandkiln.TerminateResult("requested")
    assert t.proxy.count("DELETE", process_path(t, child)) == 1
    await child.wait()
    await child.detach()


@case("termination", "If the request's acknowledgement is lost, later calls return the saved OUTCOME_UNKNOWN failure without sending another request.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(sh("sleep 30"), output=STREAM)
    cut = t.proxy.cut_answer("DELETE", process_path(t, child))
    first = await rejects(child.terminate(), "OUTCOME_UNKNOWN")
    await cut.answer()
    again = await rejects(child.terminate(), "OUTCOME_UNKNOWN")
    assert again is first
    assert t.proxy.count("DELETE", process_path(t, child)) == 1
    assert (await child.wait()).signal == "SIGKILL"  # it did take effect
    await child.detach()


@case("termination", "Termination targets the launched process; provider limitations apply to child processes and cleanup.")
async def _(t: T) -> None:
    # kilnd kills the launched process's group: its children too.
    child = await t.sandbox.processes.start(sh("sleep 300 & echo $!; wait"), output=STREAM)
    pid = (await read_until(child, "\n")).strip()
    await child.terminate()
    await child.wait()
    # Gone, or a zombie its reaper has not yet collected.
    check = await t.sandbox.exec(sh(f"s=$(cut -d' ' -f3 /proc/{pid}/stat 2>/dev/null); [ -z \"$s\" ] || [ \"$s\" = Z ] && echo gone || echo alive"))
    assert check.stdout == "gone\n"
    await child.detach()


@case("termination", "Beachside does not escalate automatically or destroy the sandbox as a fallback.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(sh("trap '' TERM; echo ready; while :; do sleep 1; done"), output=STREAM)
    await read_until(child, "ready")
    await child.signal("SIGTERM")
    await rejects(child.wait(timeout=1.5), "WAIT_ABORTED")
    assert (await child.status()).state == "running"
    assert t.proxy.count("DELETE", process_path(t, child)) == 0, "a kill was sent"
    assert (await t.sandbox.refresh())["state"] == "running"
    await child.terminate()
    await child.wait()
    await child.detach()


@case("termination", "detach() releases local input and output connections and discards unread output. Calling it again is safe.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("head -c 500000 /dev/zero; sleep 30"), stdin="pipe", output={"mode": "stream", "format": "bytes"})
    it = child.output()
    await anext(it)
    await child.detach()
    await rejects(anext(it), "DETACHED")
    await child.detach()
    await rejects(child.write("x"), "DETACHED")
    await rejects(child.terminate(), "DETACHED")
    await kill(t, child.id)


@case("termination", "It does not request a kill, resume compute or extend sandbox lifetime.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(sh("sleep 30"), stdin="pipe", output=STREAM)
    await child.detach()
    assert t.proxy.count("DELETE", process_path(t, child)) == 0
    assert t.proxy.count("POST", process_path(t, child, "/signal")) == 0
    assert t.proxy.count("POST", process_path(t, child, "/stdin/close")) == 0
    r = await record(t, child)
    assert r["state"] == "running"
    assert r["stdin"]["closed"] is False
    await kill(t, child.id)


@case("termination", "Lifecycle operations submitted through the same client prevent old process handles from sending new control requests;")
async def _(t: T) -> None:
    sb = await t.client.sandboxes.create()
    child = await sb.processes.start(sh("sleep 30"), stdin="pipe", output=STREAM)
    (waiting,) = await begun(child.wait())  # a pending call settles
    await sb.destroy()
    await rejects(waiting, "DETACHED")
    await rejects(child.write("x"), "DETACHED")
    await rejects(child.terminate(), "DETACHED")
    await rejects(child.status(), "DETACHED")


@case("termination", "Every pending call settles when its handle or client goes away.")
async def _(t: T) -> None:
    other = sandkiln.AsyncClient(t.kilnd.url, t.kilnd.token)
    sb = await other.sandboxes.get(t.sandbox.id)
    child = await sb.processes.start(sh("sleep 30"), output=STREAM)
    (w1,) = await begun(child.wait())
    await child.detach()
    await rejects(w1, "DETACHED")
    again = await sb.processes.start(sh("sleep 30"), output=STREAM)
    (w2,) = await begun(again.wait())
    await other.close()
    await rejects(w2, "DETACHED")
    # Finite mode's loop, left early, detaches: a pending wait settles.
    finite = await t.sandbox.processes.start(sh("echo x; sleep 30"))
    (w3,) = await begun(finite.wait())
    await read_until(finite, "x")
    await rejects(w3, "DETACHED")
    for h in (child, again, finite):
        await kill(t, h.id)


@case("termination", "An already-aborted signal does nothing but reject.", needs="proxy")
async def _(t: T) -> None:
    # A timeout that has run out (0) is Python's aborted signal.
    child = await t.via.processes.start(CAT, stdin="pipe", output=STREAM)
    await rejects(child.terminate(timeout=0), "WAIT_ABORTED")
    await rejects(child.signal("SIGTERM", timeout=0), "WAIT_ABORTED")
    await rejects(child.write("x", timeout=0), "WAIT_ABORTED")
    await rejects(child.close_stdin(timeout=0), "WAIT_ABORTED")
    assert t.proxy.count("DELETE", process_path(t, child)) == 0
    assert t.proxy.count("POST", process_path(t, child, "/signal")) == 0
    assert (await record(t, child))["state"] == "running"
    sb = await t.client.sandboxes.create()
    held = await sb.processes.start(sh("sleep 30"), output=STREAM)
    await rejects(sb.destroy(timeout=0), "WAIT_ABORTED")
    assert (await held.status()).state == "running", "the aborted destroy let the handle go"
    await sb.destroy()
    await child.terminate()
    await child.detach()


@case("termination", "Options the SDK does not know, or in the wrong place, are refused.")
async def _(t: T) -> None:
    # Python refuses an unknown keyword, or a positional where a keyword
    # belongs (TypeError, before anything is sent); the SDK refuses what the
    # language cannot see: keys of an options dict, and values.
    p: Any = t.sandbox.processes
    for call in (lambda: p.start(sh("true"), max_output_bytes=10), lambda: p.start(sh("true"), {"timeout": 1}),
                 lambda: ProcessTail(max_line=3)):  # type: ignore[call-arg]
        try:
            aw = call()
            if asyncio.iscoroutine(aw) or isinstance(aw, sandkiln.Opening):
                await aw
            raise AssertionError("accepted")
        except TypeError:
            pass
    await rejects(p.start(sh("true"), output={"mode": "stream", "buffer": 1}), "INVALID_ARGUMENT")
    await rejects(p.start(sh("true"), stdin="piped"), "INVALID_ARGUMENT")
    child: Any = await t.sandbox.processes.start(sh("sleep 30"), output=STREAM)
    for bad in (lambda: child.wait(timeout_ms=5), lambda: child.terminate({}), lambda: child.output(follow=False)):
        try:
            bad()
            raise AssertionError("accepted")
        except TypeError:
            pass
    await rejects(child.wait(timeout="5"), "INVALID_ARGUMENT")
    await rejects(collect(child, timeout=float("nan")), "INVALID_ARGUMENT")
    assert (await child.status()).state == "running"
    await child.terminate()
    await child.detach()


# Signals and explicit terminals.


@case("signals", 'await child.signal("SIGTERM") asks the process to shut down gracefully.')
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 1; done"), output=STREAM)
    await read_until(child, "ready")
    await child.signal("SIGTERM")
    assert (await read_until(child, "bye")).endswith("bye\n")
    assert (await child.wait()).exit_code == 0
    await child.detach()


@case("signals", "A process can ignore SIGTERM, so call child.wait() to confirm exit.")
async def _(t: T) -> None:
    # It runs on until told otherwise, not for a time the signal must beat.
    child = await t.sandbox.processes.start(sh("trap '' TERM; echo ready; read x; exit 9"), stdin="pipe", output=STREAM)
    await read_until(child, "ready")
    await child.signal("SIGTERM")
    await child.write("go\n")
    assert (await child.wait()).exit_code == 9
    await child.detach()


@case("signals", '"SIGKILL" requests a forced stop; terminate() is the convenience method for that signal.')
async def _(t: T) -> None:
    a = await t.sandbox.processes.start(sh("trap '' TERM; sleep 30"), output=STREAM)
    await a.signal("SIGKILL")
    w = await a.wait()
    assert (w.signal, w.exit_code) == ("SIGKILL", 137)
    b = await t.sandbox.processes.start(sh("sleep 30"), output=STREAM)
    await b.terminate()
    assert (await b.wait()).signal == "SIGKILL"
    await a.detach()
    await b.detach()


@case("signals", "Beachside does not automatically escalate from SIGTERM to SIGKILL or destroy the sandbox.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("trap '' TERM; echo ready; while :; do sleep 1; done"), output=STREAM)
    await read_until(child, "ready")
    await child.signal("SIGTERM")
    await rejects(child.wait(timeout=1.5), "WAIT_ABORTED")
    assert (await record(t, child))["state"] == "running"
    await child.terminate()
    await child.wait()
    await child.detach()


# Terminals.


@case("terminal", "Use sandbox.terminals.start({ command, columns: 80, rows: 24 }) for programs that need a terminal.")
async def _(t: T) -> None:
    term = await t.sandbox.terminals.start(sh("stty size; [ -t 0 ] && echo tty"), columns=80, rows=24)
    seen = await read_all(term)
    assert "24 80" in seen and "tty" in seen, seen
    await term.detach()


@case("terminal", "Its one output() iterator yields combined stdout/stderr as Uint8Array chunks.")
async def _(t: T) -> None:
    term = await t.sandbox.terminals.start(sh("echo out; echo err >&2"))
    seen = ""
    async for b in term.output():
        assert type(b) is bytes, f"a chunk of {type(b).__name__}"
        seen += b.decode()
    assert "out" in seen and "err" in seen, seen
    await term.detach()


@case("terminal", "You can write input, resize with resize({ columns: 120, rows: 40 }), check status, wait, send signals and terminate.")
async def _(t: T) -> None:
    term = await t.sandbox.terminals.start(["sh"])
    (reading,) = await begun(read_all(term))
    await term.resize(120, 40)
    assert (await term.status()).state == "running"
    await term.write("stty size\n")
    await term.signal("SIGWINCH")
    await term.write("exit 3\n")
    assert "40 120" in await reading
    assert (await term.wait()).exit_code == 3
    other = await t.sandbox.terminals.start(sh("sleep 30"))
    await other.terminate()
    assert (await other.wait()).signal == "SIGKILL"
    await term.detach()
    await other.detach()


@case("terminal", "A terminal has no closeStdin().")
async def _(t: T) -> None:
    term = await t.sandbox.terminals.start(sh("true"))
    assert not hasattr(term, "close_stdin")
    await term.wait()
    await term.detach()


@case("terminal", "Sending Ctrl+D is terminal input, not a pipe close.")
async def _(t: T) -> None:
    term = await t.sandbox.terminals.start(sh("cat; echo after-eof"))
    (reading,) = await begun(read_all(term))
    await term.write("typed\n")
    await term.write("\x04")  # the terminal's end-of-file character: cat's read returns 0
    seen = await reading
    assert "typed" in seen and "after-eof" in seen, seen
    assert (await term.wait()).exit_code == 0
    await term.detach()


@case("terminal", "Terminals can echo input, translate newlines and change how programs buffer output.")
async def _(t: T) -> None:
    term = await t.sandbox.terminals.start(sh("read x; echo got:$x"))
    (reading,) = await begun(read_all(term))
    await term.write("hi\n")
    seen = await reading
    assert "hi\r\n" in seen, f"no echo of the input: {seen!r}"
    assert "got:hi\r\n" in seen, f"newlines not translated: {seen!r}"
    await term.detach()


# Reopening.


@case("reopen", "Save sandbox.reference and child.reference() as private JSON. The process reference records its current input/output settings.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(CAT, stdin="pipe", output={"mode": "stream", "format": "bytes", "overflow": "report"})
    ref = json.loads(json.dumps(child.reference()))
    sref = json.loads(json.dumps(t.sandbox.reference))
    assert [ref["format"], ref["mode"], ref["overflow"], ref["stdin"]["pipe"]] == ["bytes", "stream", "report", True]
    assert sref["id"] == t.sandbox.id
    await child.disconnect()
    sb = await t.client.sandboxes.get(sref)
    again = await sb.processes.reopen(ref)
    await again.write("x")
    await again.close_stdin()
    async for c in again.output():
        assert isinstance(c.bytes, bytes)
    await again.detach()


@case("reopen", "Creating one rejects while EOF acknowledgement is pending or input delivery is uncertain.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(CAT, stdin="pipe", output=STREAM)
    held = t.proxy.hold("POST", process_path(t, child, "/stdin/close"))
    (closing,) = await begun(child.close_stdin())
    await held.requested()
    with fails("FAILED_PRECONDITION"):
        child.reference()
    held.release()
    await closing
    assert child.reference()
    await child.detach()


@case("reopen", "Call await child.disconnect() to release observation without closing the child's stdin. The old handle then rejects further input and control requests.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(CAT, stdin="pipe", output=STREAM)
    await child.write("before\n")
    ref = child.reference()
    await child.disconnect()
    await rejects(child.write("x"), "DETACHED")
    await rejects(child.terminate(), "DETACHED")
    await rejects(child.signal("SIGTERM"), "DETACHED")
    assert (await record(t, child))["stdin"]["closed"] is False
    again = await t.sandbox.processes.reopen(ref)
    await again.write("after\n")
    await again.close_stdin()
    assert (await collect(again)).stdout == "before\nafter\n"
    await again.detach()


@case("reopen", "For a terminal, use sandbox.terminals.reopen(savedTerminal).")
async def _(t: T) -> None:
    term = await t.sandbox.terminals.start(["sh"])
    await term.write("echo one\n")
    ref = term.reference()
    assert ref["kind"] == "terminal"
    await term.disconnect()
    await rejects(t.sandbox.processes.reopen(ref), "INVALID_ARGUMENT")
    again = await t.sandbox.terminals.reopen(ref)
    await again.write("exit 0\n")
    assert "one" in await read_all(again)
    await again.detach()


@case("reopen", "References check the provider, sandbox, connection scope and process settings.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(CAT, stdin="pipe", output=STREAM)
    ref: Any = child.reference()
    sb = await t.client.sandboxes.create()
    await rejects(sb.processes.reopen(ref), "INVALID_ARGUMENT")
    await rejects(t.sandbox.processes.reopen({**ref, "format": "utf16"}), "INVALID_ARGUMENT")
    await rejects(t.sandbox.processes.reopen({**ref, "stdin": {**ref["stdin"], "pipe": False}}), "INVALID_ARGUMENT")
    await rejects(t.sandbox.processes.reopen({**ref, "offsets": {"stdout": 99}}), "OUT_OF_RANGE")
    await sb.destroy()
    await child.terminate()
    await child.detach()


@case("reopen", "They expire after at most 24 hours and can become unavailable sooner.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("sleep 30"), output=STREAM)
    ref: Any = child.reference()
    expires = datetime.fromisoformat(ref["expiresAt"].replace("Z", "+00:00"))
    now = datetime.now(timezone.utc)
    assert expires <= now + timedelta(hours=24, seconds=1)
    iso = (lambda d: d.isoformat(timespec="milliseconds").replace("+00:00", "Z"))
    await rejects(t.sandbox.processes.reopen({**ref, "expiresAt": iso(now - timedelta(milliseconds=1))}), "FAILED_PRECONDITION")
    await rejects(t.sandbox.processes.reopen({**ref, "expiresAt": iso(now + timedelta(hours=48))}), "INVALID_ARGUMENT")
    await child.terminate()
    await child.detach()


@case("reopen", "Reopening never starts a replacement process.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(sh("exit 0"), output=STREAM)
    await child.wait()
    ref = child.reference()
    await child.disconnect()
    before = t.proxy.count("POST", start_path(t))
    again = await t.via.processes.reopen(ref)
    assert (await again.wait()).exit_code == 0
    assert t.proxy.count("POST", start_path(t)) == before
    await again.detach()


@case("reopen", "A reopened handle has outputGap: true, and its exit results always have outputComplete: false.",
      deviation="A reopened handle resumes from the offsets its reference saved: output_gap is False and output_complete True "
      "when nothing was lost; a gap is reported, exactly, only for bytes kilnd no longer had.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("echo one; read x; echo two"), stdin="pipe", output=STREAM)
    assert await read_until(child, "one\n") == "one\n"
    ref = child.reference()
    await child.disconnect()
    again = await t.sandbox.processes.reopen(ref)
    await again.write("\n")
    assert (await collect(again)).stdout == "two\n"
    assert again.output_gap is False
    assert (await again.wait()).output_complete
    await again.detach()


@case("reopen", "It reads the newly attached live stream, with no historical replay. Output during the connection gap can be lost.",
      deviation="Output during the connection gap is kept for the handle that started the process (held for kilnd's grace period) "
      "and replayed from the saved offsets, nothing repeated.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("read x; seq 1 50000"), stdin="pipe", output=STREAM)
    ref = child.reference()
    await child.disconnect()
    again = await t.sandbox.processes.reopen(ref)
    await again.write("\n")
    await again.wait()  # everything written while no one read
    out = await collect(again)
    assert out.lost == 0
    assert out.stdout.count("\n") == 50000
    await again.detach()


# Finite mode.


@case("finite", "Without it, output uses the default finite mode: at most 1 MiB of cumulative UTF-8 output.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("head -c 1048578 /dev/zero | tr '\\0' a"))
    n = 0
    with fails("OUTPUT_CAPACITY") as f:
        async for c in child.output():
            n += len(c.text)
    assert "1048576" in str(f.err)
    assert n == 1 << 20


@case("finite", "Set maxOutputBytes to a value from 1 through 1,048,576 to lower that limit.")
async def _(t: T) -> None:
    for bad in (0, 1_048_577, 1.5, -1, "10"):
        await rejects(t.sandbox.processes.start(sh("true"), output={"max_output_bytes": bad}), "INVALID_ARGUMENT", f"max_output_bytes {bad!r}")  # type: ignore[typeddict-item]
    one = await t.sandbox.processes.start(sh("printf ab"), output={"max_output_bytes": 1})
    got = ""
    with fails("OUTPUT_CAPACITY"):
        async for c in one.output():
            got += c.text
    assert got == "a"
    top = await t.sandbox.processes.start(sh("printf ab"), output={"max_output_bytes": 1_048_576})
    assert (await collect(top)).stdout == "ab"


@case("finite", "You cannot combine maxOutputBytes with stream mode.")
async def _(t: T) -> None:
    await rejects(t.sandbox.processes.start(sh("true"), output={"mode": "stream", "max_output_bytes": 10}), "INVALID_ARGUMENT")


@case("finite", "A finite reader that falls behind loses nothing of what it may keep.")
async def _(t: T) -> None:
    # 1 MiB + 2 bytes, read after all of it was written: the first 1 MiB
    # exactly, then OUTPUT_CAPACITY (never the first 2 bytes lost without a
    # word).
    total = (1 << 20) + 2
    child = await t.sandbox.processes.start(sh("printf AB; head -c 1048576 /dev/zero | tr '\\0' c"), output={"format": "bytes"})
    # Not read until all of it was written, or the process waits for its reader.
    await until(t, child, lambda r: bool(r.get("held")) or r["streams"]["stdout"]["total_bytes"] == total, "the output written")
    got = b""
    with fails("OUTPUT_CAPACITY"):
        async for c in child.output():
            got += c.bytes
    assert len(got) == 1 << 20
    assert got[:3] == b"ABc"


@case("finite", "An abort before dispatch reports WAIT_ABORTED.", needs="proxy")
async def _(t: T) -> None:
    before = t.proxy.count("POST", start_path(t))
    await rejects(t.via.processes.start(sh("true"), timeout=0), "WAIT_ABORTED")
    assert t.proxy.count("POST", start_path(t)) == before


@case("finite", "If setup is abandoned after dispatch or its acknowledgement is lost, it reports OUTCOME_UNKNOWN. "
      "Beachside never starts the command again to recover from an uncertain result.", needs="proxy")
async def _(t: T) -> None:
    m = marker("setup")
    cut = t.proxy.cut_answer("POST", start_path(t))
    await rejects(t.via.processes.start(sh(f"echo {m}; sleep 30"), output=STREAM), "OUTCOME_UNKNOWN")
    await cut.answer()
    started = [p for p in await t.sandbox.processes.list() if any(m in a for a in p.get("args", []))]
    assert len(started) == 1
    await kill(t, started[0]["id"])


@case("finite", "processes.start() rejects deadlineSeconds before starting because it cannot guarantee a portable runtime deadline.")
async def _(t: T) -> None:
    n = len(await t.sandbox.processes.list())
    await rejects(t.sandbox.processes.start(sh("true"), deadline_seconds=5), "INVALID_ARGUMENT")  # type: ignore[call-overload]
    assert len(await t.sandbox.processes.list()) == n


@case("finite", "Output replay and cursors are unsupported.",
      deviation="Every attach replays what kilnd still has of the output from the offsets asked for, then the live tail; "
      "a handle's position is a per-stream cursor.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("echo early"), output=STREAM)
    await child.wait()
    await child.detach()
    late = await t.sandbox.processes.get(child.id)
    assert (await collect(late)).stdout == "early\n"
    await late.detach()


@case("finite", "Output a process's children write after the process exits is output, bounded by the drain time.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("(sleep 0.3; echo late) & echo early"), output=STREAM)
    assert (await collect(child)).stdout == "early\nlate\n"
    r = await child.wait()
    assert (r.exit_code, r.output_cut, r.output_complete) == (0, None, True)
    await child.detach()
    cut = await t.sandbox.processes.start(sh("sleep 30 & echo started"), output=STREAM, drain_ms=200)
    assert (await collect(cut)).stdout == "started\n"
    c = await cut.wait()
    assert (c.exit_code, c.output_cut, c.output_complete) == (0, "drain_timeout", False)
    await cut.detach()


# Live callbacks on bounded exec.


@case("exec", "Beachside awaits onOutput for each chunk and captures the original bytes from the same command.")
async def _(t: T) -> None:
    inside = [0]
    seen: list[str] = []

    async def on_output(c: TextChunk) -> None:
        assert inside[0] == 0, "a callback while one was awaited"
        inside[0] += 1
        seen.append(f"{c.stream}:{c.text}")
        await asyncio.sleep(0.005)  # a callback that takes its time
        inside[0] -= 1

    r = await t.sandbox.exec(sh("printf '\\377'; echo a; echo b >&2"), on_output=on_output)
    assert r.exit_code == 0
    assert r.stdout == "\ufffda\n"
    joined = "".join(seen)
    assert "a\n" in joined and "b\n" in joined


@case("exec", "Beachside never runs the command again as a fallback.", needs="proxy")
async def _(t: T) -> None:
    m = marker("exec-once")
    cut = t.proxy.cut_request("GET", f"^/sandboxes/{t.sandbox.id}/exec-stream/[^/]+/logs")
    try:
        await t.via.exec(sh(f"echo {m}"), on_output=lambda c: None)
    except SandkilnError:
        pass
    cut.remove()
    runs = [p for p in await t.sandbox.processes.list() if any(m in a for a in p.get("args", []))]
    assert len(runs) == 1


@case("exec", "Finite stdin is split into writes followed by EOF.")
async def _(t: T) -> None:
    r = await t.sandbox.exec(sh("wc -c"), stdin="x" * 200_000, on_output=lambda c: None)
    assert r.stdout.strip() == "200000"


@case("exec", "Callback exec rejects an explicit deadlineSeconds before starting.")
async def _(t: T) -> None:
    n = len(await t.sandbox.processes.list())
    await rejects(t.sandbox.exec(sh("true"), deadline_seconds=5, on_output=lambda c: None), "INVALID_ARGUMENT")
    assert len(await t.sandbox.processes.list()) == n


@case("exec", "The error keeps the original failure as cause, and any already confirmed exit and captured bytes as confirmedExit and output. "
      "Callback failure or local cancellation does not request termination.")
async def _(t: T) -> None:
    boom = RuntimeError("boom")
    m = marker("exec-raises")

    def on_output(c: TextChunk) -> None:
        raise boom

    err = await rejects(t.sandbox.exec(sh(f"echo {m}; sleep 30"), on_output=on_output), "INTERNAL")
    assert err.__cause__ is boom
    assert err.output.stdout == m + "\n"
    assert err.confirmed_exit is None  # it was still running
    p = next(x for x in await t.sandbox.processes.list() if any(m in a for a in x.get("args", [])))
    assert p["state"] == "running"
    await kill(t, p["id"])


@case("exec", "The capture limit bounds retained bytes and reports truncation; it does not limit the total text sent to callbacks.")
async def _(t: T) -> None:
    sent = [0]

    def count(c: TextChunk) -> None:
        sent[0] += len(c.text)

    r = await t.sandbox.exec(sh("seq 1 10000"), max_output_bytes=10, on_output=count)
    assert len(r.stdout) == 10
    assert r.truncated
    assert sent[0] == r.stdout_bytes
    assert sent[0] > 10


# read_process_lines.


@case("readProcessLines", "readProcessLines(child.output(), { maxLineBytes: 16_384, signal }) yields { stream, text, partial, truncated }.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("echo one; echo two >&2"), output=STREAM)
    lines = [line async for line in read_process_lines(child.output(), max_line_bytes=16_384, timeout=10)]
    assert sorted(lines, key=lambda x: x.stream) == [
        ProcessLine("stderr", "two", partial=False, truncated=False),
        ProcessLine("stdout", "one", partial=False, truncated=False),
    ]
    await child.detach()


@case("readProcessLines", "It handles UTF-8 characters split across chunks and Windows-style CRLF newlines separately for stdout and stderr.")
async def _(t: T) -> None:
    euro = "€".encode()

    async def chunks() -> AsyncIterator[ByteChunk]:
        yield ByteChunk("stdout", euro[:1], 0, 0)
        yield ByteChunk("stderr", b"e\r", 0, 1)
        yield ByteChunk("stdout", euro[1:] + b"\r\n", 1, 3)
        yield ByteChunk("stderr", b"\n", 2, 7)

    lines = [(line.stream, line.text) async for line in read_process_lines(chunks())]
    assert lines == [("stdout", "€"), ("stderr", "e")]


@case("readProcessLines", "It clips oversized lines, marks them truncated and discards the rest until the next newline.")
async def _(t: T) -> None:
    async def chunks() -> AsyncIterator[TextChunk]:
        yield chunk("stdout", "abcdef")
        yield chunk("stdout", "ghi\nnext\n")

    lines = [(line.text, line.truncated) async for line in read_process_lines(chunks(), max_line_bytes=4)]
    assert lines == [("abcd", True), ("next", False)]


@case("readProcessLines", "A final line without a newline is marked partial.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("printf 'whole\\nend'"), output=STREAM)
    lines = [(line.text, line.partial) async for line in read_process_lines(child.output())]
    assert lines == [("whole", False), ("end", True)]
    await child.detach()


@case("readProcessLines", "For a quiet process, the iterator waits for output or cancellation.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("echo first; sleep 30"), output=STREAM)
    # Cancelling the task that waits ends the wait for output that does not come...
    lines = read_process_lines(child.output())
    assert (await anext(lines)).text == "first"
    (waiting,) = await begun(anext(lines))
    waiting.cancel()
    try:
        await waiting
        raise AssertionError("the cancelled wait returned")
    except asyncio.CancelledError:
        pass
    # ...and so does a timeout (the lines go on from where the handle stood).
    await rejects(anext(read_process_lines(child.output(), timeout=0.5)), "WAIT_ABORTED")
    # Over a caller's own iterable, which never returns: the timeout ends it too.

    async def forever() -> AsyncIterator[TextChunk]:
        yield chunk("stdout", "x\n")
        await asyncio.Event().wait()

    got: list[str] = []
    with fails("WAIT_ABORTED"):
        async for line in read_process_lines(forever(), timeout=0.5):
            got.append(line.text)
    assert got == ["x"]
    await child.terminate()
    await child.detach()


@case("readProcessLines", "In stream mode, cancellation releases only output observation.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("echo ready; read x; echo got-$x"), stdin="pipe", output=STREAM)
    # The timeout is the whole read's: the line before it is read without.
    assert await read_until(child, "ready\n") == "ready\n"
    await rejects(anext(read_process_lines(child.output(), timeout=0.5)), "WAIT_ABORTED")
    await child.write("more\n")
    assert await read_until(child, "got-more\n") == "got-more\n"
    assert (await child.wait()).exit_code == 0
    await child.detach()


# ProcessTail.


@case("createProcessTail", "createProcessTail({ maxBytes: 65_536, maxChunks: 256, maxLines: 200, maxLineBytes: 16_384 }) keeps a rolling window of recent output.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("seq 1 5000"), output=STREAM)
    tail = ProcessTail(max_bytes=65_536, max_chunks=256, max_lines=200, max_line_bytes=16_384)
    async for c in child.output():
        tail.push(c)
    s = tail.snapshot()
    assert len(s.lines) == 200
    assert s.lines[-1].text == "5000"
    assert s.lines[0].text == "4801"
    assert s.truncated  # earlier lines discarded, and it says so
    await child.detach()


@case("createProcessTail", "tail.snapshot() immediately returns { lines, truncated }, even when the process is quiet.")
async def _(t: T) -> None:
    child = await t.sandbox.processes.start(sh("echo only; sleep 30"), output=STREAM)
    tail = ProcessTail()
    async for c in child.output():
        tail.push(c)
        if "only" in c.text:
            break
    s = tail.snapshot()
    assert not asyncio.iscoroutine(s) and isinstance(s, TailSnapshot)
    assert s == TailSnapshot([ProcessLine("stdout", "only", False, False)], False)
    await child.terminate()
    await child.detach()


@case("createProcessTail", "Each snapshot is independent and can contain partial lines.")
async def _(t: T) -> None:
    tail = ProcessTail()
    tail.push(chunk("stdout", "a\npar"))
    first = tail.snapshot()
    tail.push(chunk("stdout", "tial\n"))
    assert [(x.text, x.partial) for x in first.lines] == [("a", False), ("par", True)]
    assert [(x.text, x.partial) for x in tail.snapshot().lines] == [("a", False), ("partial", False)]


@case("createProcessTail", "Discarding old output can leave the window starting in the middle of a character or line; the truncation flag records that gap.")
async def _(t: T) -> None:
    tail = ProcessTail(max_bytes=4)
    tail.push(ByteChunk("stdout", "A€xy".encode(), 0, 0))
    s = tail.snapshot()
    assert s.truncated
    assert s.lines[0].text.startswith("\ufffd")
    gap = ProcessTail()
    gap.push(chunk("stdout", "x\n"))
    assert not gap.snapshot().truncated
    gap.push(TextChunk("stdout", "", 10, 0, 8))
    assert gap.snapshot().truncated


@case("createProcessTail", "Neither helper stores a full transcript, fetches old provider logs or stops the remote process.", needs="proxy")
async def _(t: T) -> None:
    child = await t.via.processes.start(sh("seq 1 3000; echo waiting; sleep 30"), output=STREAM)
    tail = ProcessTail(max_lines=5)
    async for line in read_process_lines(child.output()):
        tail.push(chunk(line.stream, line.text + "\n"))
        if line.text == "waiting":
            break
    assert len(tail.snapshot().lines) == 5
    assert t.proxy.count("DELETE", process_path(t, child)) == 0
    assert t.proxy.count("GET", f"^/sandboxes/{t.sandbox.id}/logs") == 0, "captured logs fetched"
    assert (await record(t, child))["state"] == "running"
    await child.terminate()
    await child.detach()
