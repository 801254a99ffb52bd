"""A long-running server in a sandbox, followed by its preview URL.

The server's log lines are printed as they come; once its port answers
(asked through kilnd, for up to 15 s), the preview URL is printed: a URL that
reaches the port without kilnd's token, on a host of its own,
ID.localhost, which browsers resolve to this machine themselves. The server
runs until Ctrl-C (or --serve-for seconds); then it is terminated and its
exit waited for within a 10 s budget, and the sandbox is destroyed. kilnd's
address and token come from KILN_ADDR and KILN_TOKEN.

    KILN_ADDR=127.0.0.1:7777 KILN_TOKEN=$(cat /var/lib/sandkiln/token) python3 preview_server.py
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import sandkiln

PAGE = "<h1>hello from the sandbox</h1>\n"


@dataclass
class Served:
    url: str
    page: str
    terminated: sandkiln.TerminateResult
    exit: sandkiln.WaitResult
    logs: list[str] = field(default_factory=list)


async def ready(sandbox: sandkiln.AsyncSandbox, port: int, within: float) -> str:
    """The page at / once the server on port answers 200, asked every 0.1 s
    for up to within seconds (the server may still be starting). Asked
    through kilnd's port proxy: this program need not resolve the preview's
    host, as a browser does."""
    async with asyncio.timeout(within):
        while True:
            try:
                async with await sandbox.ports.fetch(port, "/") as resp:
                    body = await resp.read()
                    if resp.status == 200:
                        return body.decode()
            except sandkiln.UnavailableError:
                pass  # nothing listens yet
            await asyncio.sleep(0.1)


async def serve(client: sandkiln.AsyncClient, *, port: int = 8080, serve_for: float | None = None,
                on_line: Callable[[str], object] = print) -> Served:
    async with client.sandboxes.create() as sandbox:
        await sandbox.files.write("/workspace/index.html", PAGE)
        server = await sandbox.processes.start(
            ["python3", "-u", "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", "/workspace"],
            output={"mode": "stream"})
        logs: list[str] = []

        async def follow() -> None:
            try:
                async for line in sandkiln.read_process_lines(server.output()):
                    logs.append(line.text)
                    on_line(f"[server {line.stream}] {line.text}")
            except sandkiln.DetachedError:
                pass  # the handle was let go: the logs end here

        following = asyncio.create_task(follow())
        try:
            # Starting the server did not publish its port: the preview does.
            preview = await sandbox.previews.create(port, ttl_seconds=3600)
            url = preview["url"]
            page = await ready(sandbox, port, 15)
            on_line(f"serving at {url}")
            try:
                if serve_for is None:
                    await asyncio.Event().wait()  # until Ctrl-C cancels it
                elif serve_for > 0:
                    await asyncio.sleep(serve_for)
            except asyncio.CancelledError:
                # Ctrl-C: the cleanup below still runs, within its budget.
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
            # The cleanup's budget: 10 s for the request and the exit.
            async with asyncio.timeout(10):
                terminated = await server.terminate()
                exit = await server.wait()
                # Its last lines may still be on their way: read to the
                # output's end before the handle is let go.
                await asyncio.wait([following])
            return Served(url, page, terminated, exit, logs)
        finally:
            await server.detach()
            await following


async def main() -> None:
    p = argparse.ArgumentParser(description="A long-running server in a sandbox, followed by its preview URL.")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--serve-for", type=float, default=None, help="seconds to serve (default: until Ctrl-C)")
    args = p.parse_args()
    async with sandkiln.AsyncClient() as client:
        served = await serve(client, port=args.port, serve_for=args.serve_for)
        print(f"terminate: {served.terminated.status}; exit: {served.exit.exit_code} ({served.exit.signal})")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
