"""A cluster's nodes and readiness, against a stand-in for a clustered kilnd
(its answers as api/openapi.yaml has them), through both clients: no
cluster is started. A kilnd whose cluster is down is an answer of ready(),
not an error."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import sandkiln
from checks import Fails, rejects


class Kilnd:
    """What the stand-in answers, and the requests it had."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.draining = False
        self.readyz: tuple[int, Any] = (200, {"status": "ok", "cluster": {"node": "a", "state": "connected"}})

    def node(self, name: str) -> dict[str, Any]:
        return {
            "name": name, "state": "draining" if name == "b" and self.draining else "ready", "api_url": f"http://{name}:7777",
            "labels": {"zone": "a"}, "version": "v1", "incarnation": f"i-{name}", "started_at": "2026-12-05T02:00:00Z",
            "seen_at": "2026-12-05T03:00:00Z", "cpus": 2, "memory_bytes": 8 << 30, "free_memory_bytes": 6 << 30, "sandboxes": 1,
        }


@pytest.fixture
def kilnd() -> Iterator[tuple[Kilnd, str]]:
    k = Kilnd()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def answer(self, status: int, body: Any) -> None:
            raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def refuse(self, status: int, code: str, message: str) -> None:
            self.answer(status, {"error": {"code": code, "message": message}})

        def handle_one(self) -> None:
            k.requests.append(f"{self.command} {self.path}")
            path = self.path.split("?")[0]
            if path == "/readyz":
                return self.answer(*k.readyz)
            if self.headers.get("Authorization") != "Bearer t":
                return self.refuse(401, "unauthorized", "no token")
            if self.command == "GET" and path == "/nodes":
                return self.answer(200, [{**k.node("a"), "self": True}, k.node("b")])
            if path in ("/nodes/c", "/nodes/c/drain"):
                return self.refuse(404, "not_found", "no node c in the cluster")
            if self.command == "GET" and path == "/nodes/b":
                return self.answer(200, k.node("b"))
            if path == "/nodes/b/drain" and self.command in ("POST", "DELETE"):
                k.draining = self.command == "POST"
                return self.answer(200, k.node("b"))
            if self.command == "GET" and path == "/sandboxes":
                return self.answer(200, [{"id": "b" * 64, "state": "node_lost", "node": "b"}])
            if self.command == "POST" and path == "/sandboxes":
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                k.requests[-1] += " " + json.dumps(body, sort_keys=True)
                return self.answer(201, {"id": "c" * 64, "state": "running", "node": body.get("node", "a")})
            self.refuse(404, "not_found", "no route")

        do_GET = do_POST = do_DELETE = handle_one

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield k, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_nodes_async(kilnd: tuple[Kilnd, str]) -> None:
    k, url = kilnd

    async def run() -> None:
        async with sandkiln.AsyncClient(url, "t") as c:
            nodes = await c.nodes.list()
            assert [(n["name"], n["state"], n.get("self", False)) for n in nodes] == [("a", "ready", True), ("b", "ready", False)]
            assert nodes[1]["free_memory_bytes"] == 6 << 30
            assert (await c.nodes.get("b"))["state"] == "ready"
            e = await rejects(c.nodes.get("c"), "NOT_FOUND")
            assert e.status == 404
            assert (await c.nodes.drain("b"))["state"] == "draining"
            assert (await c.nodes.get("b"))["state"] == "draining"
            assert (await c.nodes.undrain("b"))["state"] == "ready"
            await rejects(c.nodes.drain("c"), "NOT_FOUND")
            await rejects(c.nodes.get(""), "INVALID_ARGUMENT")
            listed = await c.sandboxes.list(node="b", state="node_lost")
            assert [(s.get("node"), s.get("state")) for s in listed] == [("b", "node_lost")]
            sb = await c.sandboxes.create(node="b", constraints=["zone=a"])
            assert sb.info.get("node") == "b"

    asyncio.run(asyncio.wait_for(run(), 60))
    assert k.requests == [
        "GET /nodes", "GET /nodes/b", "GET /nodes/c", "POST /nodes/b/drain", "GET /nodes/b", "DELETE /nodes/b/drain",
        "POST /nodes/c/drain", "GET /sandboxes?state=node_lost&node=b",
        'POST /sandboxes {"constraints": ["zone=a"], "node": "b"}',
    ]


def test_nodes_sync(kilnd: tuple[Kilnd, str]) -> None:
    k, url = kilnd
    with sandkiln.Client(url, "t") as c:
        assert [n["name"] for n in c.nodes.list()] == ["a", "b"]
        assert c.nodes.drain("b")["state"] == "draining"
        assert c.nodes.get("b")["state"] == "draining"
        assert c.nodes.undrain("b")["state"] == "ready"
        with Fails("NOT_FOUND"):
            c.nodes.get("c")
        assert [s["id"] for s in c.sandboxes.list(node="b")] == ["b" * 64]
        assert c.sandboxes.create(node="b").info.get("node") == "b"
    assert k.requests[-2:] == ["GET /sandboxes?node=b", 'POST /sandboxes {"node": "b"}']


def test_ready_the_cluster_down_is_an_answer(kilnd: tuple[Kilnd, str]) -> None:
    k, url = kilnd
    with sandkiln.Client(url, "t") as c:
        assert c.ready() == {"status": "ok", "cluster": {"node": "a", "state": "connected"}}
        k.readyz = (503, {"status": "cluster down", "cluster": {"node": "a", "state": "down"}})
        assert c.ready() == {"status": "cluster down", "cluster": {"node": "a", "state": "down"}}
        # A 503 that is not kilnd's readiness is an error; so is any other
        # refusal, or an answer that is no health report.
        for answer, code in [
            ((503, {"error": {"code": "unavailable", "message": "shutting down"}}), "UNAVAILABLE"),
            ((503, "<html>Service Unavailable</html>"), "INTERNAL"),
            ((500, {"error": {"code": "internal", "message": "oops"}}), "INTERNAL"),
            ((200, {}), "INTERNAL"),
        ]:
            k.readyz = answer
            with Fails(code, f"ready() answered {answer}") as f:
                c.ready()
            assert f.err is not None and f.err.status == answer[0]
