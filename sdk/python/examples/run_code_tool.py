"""A tool an agent framework registers: run_code(code) -> str.

The model gets back a string that says what happened, whatever happened:
the exit code (and the signal, if one ended the program), what the program
printed on stdout and stderr, whether its output was truncated, and whether
it was stopped at its deadline. The code runs in a sandbox of kilnd's, made
on the first call and destroyed when the program exits; kilnd's address and
token come from KILN_ADDR and KILN_TOKEN.

    KILN_ADDR=127.0.0.1:7777 KILN_TOKEN=$(cat /var/lib/sandkiln/token) \\
        python3 run_code_tool.py 'print(sum(range(10)))'

Registering it is the framework's part: most take the function and read its
name, docstring and annotations, or a JSON schema such as TOOL below.
"""

from __future__ import annotations

import atexit
import sys
import threading

import sandkiln

# What goes back to the model at most, both streams together: a model's
# context is small, and a program can print without end.
MAX_OUTPUT_BYTES = 16 << 10
# How long a run may take before kilnd kills it.
DEADLINE_SECONDS = 30.0

TOOL = {
    "name": "run_code",
    "description": "Run Python 3 code in an isolated sandbox and return its exit code, stdout and stderr. "
                   "Files written under /workspace are kept between calls.",
    "parameters": {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "A Python 3 program; print what you want to see."}},
        "required": ["code"],
    },
}

_lock = threading.Lock()
_client: sandkiln.Client | None = None
_sandbox: sandkiln.Sandbox | None = None


def _tool_sandbox() -> sandkiln.Sandbox:
    """The sandbox the tool runs code in: one, made on first use, for every
    call of this program (a framework may call from several threads)."""
    global _client, _sandbox
    with _lock:
        if _sandbox is None:
            _client = sandkiln.Client()
            _sandbox = _client.sandboxes.create()
            atexit.register(close)
        return _sandbox


def close() -> None:
    """Destroys the tool's sandbox, if it made one; at exit if not before."""
    global _client, _sandbox
    with _lock:
        client, sandbox, _client, _sandbox = _client, _sandbox, None, None
    atexit.unregister(close)
    try:
        if sandbox is not None:
            sandbox.destroy()
    finally:
        if client is not None:
            client.close()


def run_code(code: str) -> str:
    """Run Python 3 code in an isolated sandbox and return its exit code,
    stdout and stderr. Output is truncated past 16 KiB, and a run is
    stopped after 30 seconds; the result says when either happened."""
    result = _tool_sandbox().exec(["python3", "-c", code], max_output_bytes=MAX_OUTPUT_BYTES, deadline_seconds=DEADLINE_SECONDS)
    return describe(result)


def describe(r: sandkiln.ExecOutput) -> str:
    """An exec's result as the model reads it: nothing left out silently."""
    exit = f"exit code: {r.exit_code}"
    if r.signal:
        exit += f" (ended by {r.signal}{', out of memory' if r.oom_killed else ''})"
    lines = [exit]
    if r.timed_out:
        lines.append(f"stopped: the run took longer than {DEADLINE_SECONDS:g} seconds")
    lines.append("stdout:" + ("\n" + r.stdout if r.stdout else " (empty)"))
    lines.append("stderr:" + ("\n" + r.stderr if r.stderr else " (empty)"))
    if r.truncated:
        lines.append(f"[output truncated: the program wrote {r.stdout_bytes} bytes to stdout and {r.stderr_bytes} to stderr; "
                     f"the first {MAX_OUTPUT_BYTES} bytes are shown]")
    return "\n".join(lines)


if __name__ == "__main__":
    print(run_code(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read()))
