"""The streaming contract's cases (contract.py), each a test named by the
seed's sentence it holds the SDK to, against a real kilnd."""

from __future__ import annotations

import asyncio

import pytest

import sandkiln
from conftest import TEST_TIMEOUT, Env
from contract import CASES, Case, T


def test_every_sentence_once() -> None:
    # One case per sentence, as the TypeScript suite has them.
    sentences = [c.sentence for c in CASES]
    assert len(sentences) == len(set(sentences)) == 100


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
