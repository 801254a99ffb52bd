"""Where kiln.v1 does better than the seed, against a real kilnd: output
resumed from offsets after a dropped connection, exact gaps, references
that other clients reopen, handles let go together."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import sandkiln
from conftest import Env
from checks import begun, collect, fails, rejects, sh
from proxy import CuttingProxy


def arun(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 170))


class Ctx:
    def __init__(self, env: Env) -> None:
        self.env = env

    async def __aenter__(self) -> tuple[sandkiln.AsyncClient, sandkiln.AsyncSandbox]:
        self.client = sandkiln.AsyncClient(self.env.kilnd.url, self.env.kilnd.token)
        return self.client, await self.client.sandboxes.get(self.env.sandbox_id)

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()


def test_dropped_connection_resumes_without_loss_or_repeat(env: Env) -> None:
    # A proxy that cuts every connection after 64 KiB from kilnd: less than a
    # full-size frame, but a connection's frames start at 16 KiB, so each
    # connection brings whole frames and each resume gets further.
    cut = CuttingProxy(env.kilnd.url, 64 * 1024)

    async def run() -> None:
        async with Ctx(env) as (client, sandbox):
            lines = 250_000
            child = await sandbox.processes.start(sh(f"i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo $i; done"), output={"mode": "stream"})
            via_client = sandkiln.AsyncClient(cut.url, env.kilnd.token)
            via = await (await via_client.sandboxes.get(sandbox.id)).processes.reopen(child.reference())
            await child.detach()
            parts: list[str] = []
            breaks = 0
            while True:
                try:
                    async for c in via.output():
                        parts.append(c.text)
                    break
                except sandkiln.UnavailableError:
                    breaks += 1
                    assert breaks < 200, f"{breaks} breaks, {sum(map(len, parts))} characters"
            assert breaks >= 1
            assert "".join(parts) == "".join(f"{i}\n" for i in range(1, lines + 1))
            assert via.output_gap is False
            assert (await via.wait()).output_complete
            await via.detach()
            await via_client.close()

    try:
        arun(run())
    finally:
        cut.close()


def test_disconnect_reference_reopen_elsewhere(env: Env) -> None:
    async def run() -> None:
        async with Ctx(env) as (client, sandbox):
            child = await sandbox.processes.start(sh("echo one; read x; echo two; echo err >&2"), stdin="pipe", output={"mode": "stream"})
            ref = child.reference()  # before the reading: it follows the handle
            first = ""
            async for c in child.output():
                first += c.text
                if first == "one\n":
                    break
            await child.disconnect()
            saved = json.loads(json.dumps({"sandbox": sandbox.reference, "process": ref}))
            assert saved["process"]["offsets"]["stdout"] == 4
            await rejects(child.write("x\n"), "DETACHED")
            # Another client, as another program would after a restart.
            async with sandkiln.AsyncClient(env.kilnd.url, env.kilnd.token) as other:
                again = await (await other.sandboxes.get(saved["sandbox"])).processes.reopen(saved["process"])
                await again.write("go\n")
                rest = await collect(again)
                assert (rest.stdout, rest.stderr) == ("two\n", "err\n")
                assert again.output_gap is False
                assert (await again.wait()).output_complete
            await rejects(sandbox.processes.reopen({**saved["process"], "sandbox": "other"}), "INVALID_ARGUMENT")
            await rejects(sandbox.processes.reopen({**saved["process"], "process": "01a22779-5cfd-7451-9354-2e19949d5c7f"}), "NOT_FOUND")

    arun(run())


def test_reopen_after_eviction_counts_the_gap_exactly(env: Env) -> None:
    async def run() -> None:
        async with Ctx(env) as (client, sandbox):
            total = 3 << 20  # three times kilnd's ring
            child = await sandbox.processes.start(sh(f"head -c {total} /dev/zero"),
                                                  output={"mode": "stream", "format": "bytes", "flow": "drop", "overflow": "report"})
            ref = child.reference()
            await child.disconnect()
            q = await sandbox.processes.reopen(ref)
            await q.wait()
            got = lost = 0
            async for c in q.output():
                lost += c.lost
                got += len(c.bytes)
            assert lost > 0
            assert got + lost == total
            assert q.output_gap and q.lost_bytes == lost
            assert not (await q.wait()).output_complete
            await q.detach()

    arun(run())


def test_text_after_a_gap(env: Env) -> None:
    # 3 MiB of €, three times the ring, read after the fact: the decoder
    # starts again after the gap, a cut character is U+FFFD, and every byte
    # is accounted for.
    async def run() -> None:
        async with Ctx(env) as (client, sandbox):
            n = 1 << 20
            child = await sandbox.processes.start(
                sh(f"head -c {n} /dev/zero | sed 's/\\x00/€/g'"),
                output={"mode": "stream", "flow": "drop", "overflow": "report"})
            ref = child.reference()
            await child.disconnect()
            q = await sandbox.processes.reopen(ref)
            await q.wait()
            text = ""
            lost = 0
            async for c in q.output():
                lost += c.lost
                text += c.text
            assert lost > 0
            assert re.fullmatch("\ufffd{0,2}(€)+", text), text[:4]
            replaced = text.count("\ufffd")
            assert lost + replaced + 3 * (len(text) - replaced) == 3 * n
            await q.detach()

    arun(run())


def test_slow_consumer_loses_nothing(env: Env) -> None:
    async def run() -> None:
        async with Ctx(env) as (client, sandbox):
            total = 4 << 20  # four times kilnd's ring
            child = await sandbox.processes.start(sh(f"head -c {total} /dev/zero"), output={"mode": "stream", "format": "bytes"})
            got = 0
            slow = 0
            async for c in child.output():
                assert c.offset == got and c.lost == 0, "a chunk repeated or skipped"
                got += len(c.bytes)
                if slow < 64:
                    slow += 1
                    await asyncio.sleep(0.002)  # a reader slower than the output
            assert got == total
            r = await child.wait()
            assert r.output_complete and r.exit_code == 0
            await child.detach()

    arun(run())


def test_get_a_process_another_client_started(env: Env) -> None:
    async def run() -> None:
        async with Ctx(env) as (client, sandbox):
            term = await sandbox.terminals.start(sh("echo from-a-terminal; read x"))
            child = await sandbox.processes.start(sh("echo early; read x; echo late"), stdin="pipe", output={"mode": "stream"})
            async with sandkiln.AsyncClient(env.kilnd.url, env.kilnd.token) as other:
                sb = await other.sandboxes.get(sandbox.id)
                h = await sb.processes.get(child.id)
                assert isinstance(h, sandkiln.AsyncProcessHandle)
                await h.write("go\n")  # its stdin pipe, from kilnd's account
                assert (await collect(h)).stdout == "early\nlate\n"
                t = await sb.processes.get(term.id)
                assert isinstance(t, sandkiln.AsyncTerminalHandle)
                await t.write("\n")
                seen = b""
                async for b in t.output():
                    seen += b
                assert b"from-a-terminal" in seen
                assert [p["id"] for p in await sb.processes.list() if p["id"] in (child.id, term.id)]
                await rejects(sb.processes.get("01a22779-5cfd-7451-9354-2e19949d5c7f"), "NOT_FOUND")
            await child.detach()
            await term.detach()

    arun(run())


def test_terminal_reopen_resumes(env: Env) -> None:
    async def run() -> None:
        async with Ctx(env) as (client, sandbox):
            term = await sandbox.terminals.start(["sh"], columns=100, rows=30)
            await term.write("echo one-$((1+1))\n")
            seen = b""
            async for b in term.output():
                seen += b
                if b"one-2" in seen:
                    break
            ref = term.reference()
            await term.disconnect()
            again = await sandbox.terminals.reopen(ref)
            await again.write("echo two-$((2+2)); exit 0\n")
            rest = b""
            async for b in again.output():
                rest += b
            assert b"two-4" in rest and b"one-2" not in rest, rest
            assert (await again.wait()).exit_code == 0
            await again.detach()
            with fails("INVALID_ARGUMENT"):
                await again.resize(0, 10)

    arun(run())


def test_destroy_lets_go_of_every_handle_of_the_client(env: Env) -> None:
    async def run() -> None:
        async with Ctx(env) as (client, sandbox):
            sb = await client.sandboxes.create()
            same = await client.sandboxes.get(sb.id)  # another handle on the same sandbox
            a = await sb.processes.start(sh("sleep 30"), output={"mode": "stream"})
            b = await same.processes.start(sh("sleep 30"), output={"mode": "stream"})
            (waiting,) = await begun(b.wait())
            await sb.destroy()
            await rejects(waiting, "DETACHED")
            await rejects(a.status(), "DETACHED")
            await rejects(b.terminate(), "DETACHED")

    arun(run())


def test_errors_carry_kilnds_code(env: Env) -> None:
    async def run() -> None:
        async with Ctx(env) as (client, sandbox):
            e = await rejects(sandbox.processes.start(["/no/such/program"]), "INVALID_ARGUMENT")
            assert (e.status, e.kiln_code) == (400, "command_not_found")
            assert isinstance(e, sandkiln.InvalidArgumentError) and isinstance(e, ValueError)
            e = await rejects(client.sandboxes.get("no-such-sandbox"), "NOT_FOUND")
            assert isinstance(e, sandkiln.NotFoundError) and e.status == 404
            e = await rejects(_wait_timeout(sandbox), "WAIT_ABORTED")
            assert isinstance(e, TimeoutError)
            assert set(sandkiln.ERROR_CODES) == {
                "OUTPUT_CAPACITY", "OUTCOME_UNKNOWN", "WAIT_ABORTED", "UNAVAILABLE", "NOT_FOUND", "INVALID_ARGUMENT", "UNAUTHENTICATED",
                "PERMISSION_DENIED", "FAILED_PRECONDITION", "OUT_OF_RANGE", "ALREADY_EXISTS", "PAUSED", "STDIN_CLOSED", "INPUT_UNCERTAIN",
                "INPUT_CAPACITY", "DETACHED", "OUTPUT_IN_USE", "UNSUPPORTED", "INTERNAL"}

    arun(run())


async def _wait_timeout(sandbox: sandkiln.AsyncSandbox) -> None:
    child = await sandbox.processes.start(sh("sleep 30"), output={"mode": "stream"})
    try:
        await child.wait(timeout=0.1)
    finally:
        await child.terminate()
        await child.detach()
