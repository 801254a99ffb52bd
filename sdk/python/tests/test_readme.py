"""The READMEs' Python examples, run as a user runs them: the repository's
quick start and the package README's two, as scripts with kilnd's address
and token in KILN_ADDR and KILN_TOKEN."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import sandkiln
from conftest import Env

REPO = Path(__file__).resolve().parents[3]
THREE_LINES = "line-1\nline-2\nline-3\n"


def blocks(readme: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", readme.read_text(), re.M | re.S)


def run(env: Env, code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "KILN_ADDR": env.kilnd.url, "KILN_TOKEN": env.kilnd.token})
    assert r.returncode == 0, r.stderr
    return r.stdout


def sandboxes(env: Env) -> set[str]:
    with sandkiln.Client(env.kilnd.url, env.kilnd.token) as c:
        return {s["id"] for s in c.sandboxes.list()}


@pytest.mark.parametrize(("readme", "index", "check"), [
    ("README.md", 0, lambda out: out == THREE_LINES + "exit code 0\n"),
    # It prints the WaitResult's repr, whose fields are the package's own.
    ("sdk/python/README.md", 0, lambda out: out.startswith(THREE_LINES + "WaitResult(exit_code=0, signal=None, ")
     and "output_complete=True" in out),
    # stdout and stderr are pipes of their own: either may come first.
    ("sdk/python/README.md", 1, lambda out: out in ("stdout 'out\\n'\nstderr 'err\\n'\n0\n",
                                                    "stderr 'err\\n'\nstdout 'out\\n'\n0\n")),
])
def test_readme_example(env: Env, readme: str, index: int, check: Callable[[str], bool]) -> None:
    code = blocks(REPO / readme)[index]
    assert len(code.splitlines()) <= 16, "an example in a README is short"
    before = sandboxes(env)
    out = run(env, code)
    assert check(out), out
    assert sandboxes(env) == before, "the example's sandbox outlived it"
