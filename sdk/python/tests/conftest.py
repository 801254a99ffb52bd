"""One kilnd for the whole run, a proxy before it, and a sandbox the tests
share; each test bounded, so that a hang fails it instead of the run."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import sandkiln
from kilnd import Kilnd
from proxy import Proxy

# A test's bound: it fails the test, it is not a claim about timing. The
# cases that wait out the 30 s control timeout need most of it.
TEST_TIMEOUT = 180


@dataclass
class Env:
    """What a test gets: kilnd, the proxy, and the shared sandbox's id."""

    kilnd: Kilnd
    proxy: Proxy
    sandbox_id: str


@pytest.fixture(scope="session")
def kilnd() -> Iterator[Kilnd]:
    k = Kilnd()
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture(scope="session")
def proxy(kilnd: Kilnd) -> Iterator[Proxy]:
    p = Proxy(kilnd.url)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="session")
def env(kilnd: Kilnd, proxy: Proxy) -> Iterator[Env]:
    async def create() -> str:
        async with sandkiln.AsyncClient(kilnd.url, kilnd.token) as c:
            return (await c.sandboxes.create()).id

    async def delete(sid: str) -> None:
        async with sandkiln.AsyncClient(kilnd.url, kilnd.token) as c:
            await (await c.sandboxes.get(sid)).destroy(remove_logs=True)

    sid = asyncio.run(create())
    try:
        yield Env(kilnd, proxy, sid)
    finally:
        asyncio.run(delete(sid))


@pytest.fixture(autouse=True)
def bounded() -> Iterator[None]:
    """Fails a test that runs past TEST_TIMEOUT, in the main thread, where
    it waits: a synchronous call waiting on the client's loop is
    interrupted and cancelled there."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"the test did not end within {TEST_TIMEOUT} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_TIMEOUT + 10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
