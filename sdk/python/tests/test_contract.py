"""The streaming contract's cases (contract.py), each a test named by the
seed's sentence it holds the SDK to, against a real kilnd."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

import sandkiln
from conftest import TEST_TIMEOUT, Env
from contract import CASES, Case, T


TYPESCRIPT_CASES = Path(__file__).resolve().parents[2] / "typescript" / "test" / "contract" / "cases.mjs"


def test_every_sentence_once() -> None:
    # One case per sentence, as the TypeScript suite has them.
    sentences = [c.sentence for c in CASES]
    assert len(sentences) == len(set(sentences)) == 100


def test_the_typescript_suites_cases() -> None:
    """The same cases as the TypeScript suite's, in its order and under its
    sections: a case added there and not here fails this."""
    src = TYPESCRIPT_CASES.read_text()
    fields = re.findall(r"""^ {4}(section|sentence): (?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'),?$""", src, re.M)
    ts = [(name, (dq or sq).replace('\\"', '"').replace("\\'", "'")) for name, dq, sq in fields]
    want = [(ts[i][1], ts[i + 1][1]) for i in range(0, len(ts), 2)]
    assert all(ts[i][0] == "section" and ts[i + 1][0] == "sentence" for i in range(0, len(ts), 2)), ts[:4]
    assert [(c.section, c.sentence) for c in CASES] == want


@pytest.mark.parametrize("case", CASES, ids=[f"[{c.section}] {c.sentence}" for c in CASES])
def test_contract(case: Case, env: Env) -> None:
    async def run() -> None:
        client = sandkiln.AsyncClient(env.kilnd.url, env.kilnd.token)
        via_client = sandkiln.AsyncClient(env.proxy.url, env.kilnd.token)
        try:
            t = T(client, await client.sandboxes.get(env.sandbox_id), await via_client.sandboxes.get(env.sandbox_id),
                  env.proxy, env.kilnd)
            await asyncio.wait_for(case.run(t), TEST_TIMEOUT)
        finally:
            await client.close()
            await via_client.close()

    asyncio.run(run())
