"""One stream-mode read of a burst through the Python SDK, for the
benchmark's sdk section, as bench/sdkburst.mjs reads it through the
TypeScript SDK: starts `head -c SIZE /dev/zero` in the sandbox SANDBOX of
kilnd at KILN_ADDR (token KILN_TOKEN), reads its output in bytes, and prints
{"bytes":N,"ms":T,"complete":C}: T from the start request to the output's
end. With the argument "sync", through Client (the same implementation on an
event loop of its own thread); else through AsyncClient. The package is
imported from the repository's sdk/python/src, not installed."""

import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python", "src"))

import sandkiln  # noqa: E402

SIZE = int(os.environ["SIZE"])
ARGV = ["head", "-c", str(SIZE), "/dev/zero"]
OUTPUT: sandkiln.ByteOutput = {"mode": "stream", "format": "bytes"}


async def read_async() -> dict[str, object]:
    async with sandkiln.AsyncClient(os.environ["KILN_ADDR"], os.environ["KILN_TOKEN"]) as client:
        sandbox = await client.sandboxes.get(os.environ["SANDBOX"])
        t0 = time.perf_counter()
        child = await sandbox.processes.start(ARGV, output=OUTPUT)
        n = 0
        async for c in child.output():
            n += len(c.bytes)
        ms = (time.perf_counter() - t0) * 1000
        r = await child.wait()
        await child.detach()
    return {"bytes": n, "ms": ms, "complete": r.output_complete}


def read_sync() -> dict[str, object]:
    with sandkiln.Client(os.environ["KILN_ADDR"], os.environ["KILN_TOKEN"]) as client:
        sandbox = client.sandboxes.get(os.environ["SANDBOX"])
        t0 = time.perf_counter()
        child = sandbox.processes.start(ARGV, output=OUTPUT)
        n = 0
        for c in child.output():
            n += len(c.bytes)
        ms = (time.perf_counter() - t0) * 1000
        r = child.wait()
        child.detach()
    return {"bytes": n, "ms": ms, "complete": r.output_complete}


if __name__ == "__main__":
    print(json.dumps(read_sync() if sys.argv[1:] == ["sync"] else asyncio.run(read_async())))
