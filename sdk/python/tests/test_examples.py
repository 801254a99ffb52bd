"""The examples, run as their users run them (python3 FILE, kilnd from the
environment) and as modules whose results a test can hold to what they
should be."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import sandkiln
from checks import preview_get
from conftest import Env

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import preview_server  # noqa: E402
import run_code_tool  # noqa: E402


def script(env: Env, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=150,
                          env={**os.environ, "KILN_ADDR": env.kilnd.url, "KILN_TOKEN": env.kilnd.token})


def sandboxes(env: Env) -> set[str]:
    with sandkiln.Client(env.kilnd.url, env.kilnd.token) as c:
        return {s["id"] for s in c.sandboxes.list()}


def test_run_code_tool_as_a_script(env: Env) -> None:
    before = sandboxes(env)
    r = script(env, "run_code_tool.py", "import sys; print(6 * 7); print('to stderr', file=sys.stderr); sys.exit(3)")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "exit code: 3\nstdout:\n42\n\nstderr:\nto stderr\n\n", r.stdout
    assert sandboxes(env) == before, "the tool's sandbox outlived its program"


def test_run_code_tool_states_what_happened(env: Env, monkeypatch: Any) -> None:
    monkeypatch.setenv("KILN_ADDR", env.kilnd.url)
    monkeypatch.setenv("KILN_TOKEN", env.kilnd.token)
    before = sandboxes(env)
    try:
        assert run_code_tool.run_code("print('hi')").startswith("exit code: 0\nstdout:\nhi\n")
        # Files are kept between calls: one sandbox for the program.
        run_code_tool.run_code("open('/workspace/state.txt', 'w').write('kept')")
        assert "kept" in run_code_tool.run_code("print(open('/workspace/state.txt').read())")
        assert len(sandboxes(env) - before) == 1
        flood = run_code_tool.run_code("print('q' * 100000)")
        assert flood.endswith("[output truncated: the program wrote 100001 bytes to stdout and 0 to stderr; "
                              "the first 16384 bytes are shown]"), flood[-200:]
        assert flood.count("q") == 16384
        failed = run_code_tool.run_code("raise ValueError('no')")
        assert failed.startswith("exit code: 1\n") and "ValueError: no" in failed
        killed = run_code_tool.run_code("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        assert killed.startswith("exit code: 137 (ended by SIGKILL)")
        assert run_code_tool.TOOL["name"] == run_code_tool.run_code.__name__
    finally:
        run_code_tool.close()
    assert sandboxes(env) == before


def test_preview_server_as_a_script(env: Env) -> None:
    before = sandboxes(env)
    r = script(env, "preview_server.py", "--serve-for", "0")
    assert r.returncode == 0, r.stderr
    port = urlsplit(env.kilnd.url).port
    assert re.search(rf"^serving at http://[0-9a-f]{{16}}\.localhost:{port}/preview/[\w-]+/$", r.stdout, re.M), r.stdout
    assert "terminate: requested; exit: 137 (SIGKILL)" in r.stdout, r.stdout
    assert sandboxes(env) == before


def test_preview_server(env: Env) -> None:
    async def run() -> preview_server.Served:
        lines: list[str] = []

        def on_line(line: str) -> None:
            lines.append(line)
            if line.startswith("serving at "):
                # While it serves, the URL reaches the page, as a browser
                # on this machine reaches it, without kilnd's token.
                pages.append(preview_get(line.removeprefix("serving at ")))

        async with sandkiln.AsyncClient(env.kilnd.url, env.kilnd.token) as client:
            served = await preview_server.serve(client, port=8081, serve_for=0, on_line=on_line)
        assert f"serving at {served.url}" in lines
        return served

    pages: list[tuple[int, bytes]] = []
    before = sandboxes(env)
    served = asyncio.run(asyncio.wait_for(run(), 150))
    assert served.page == preview_server.PAGE
    assert pages == [(200, preview_server.PAGE.encode())]
    assert served.terminated == sandkiln.TerminateResult("requested")
    assert served.exit.signal == "SIGKILL"
    assert any("GET / " in line for line in served.logs), served.logs
    assert sandboxes(env) == before, "its sandbox was destroyed"
