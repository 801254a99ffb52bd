// A cluster's nodes and readiness, against a stand-in for a clustered
// kilnd (its answers as api/openapi.yaml has them): no cluster is started.
// A kilnd whose cluster is down is an answer of ready(), not a rejection.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";

import { Client, SandkilnError } from "../dist/index.js";

const requests = [];
let draining = false;
let readyz = { status: 200, body: { status: "ok", cluster: { node: "a", state: "connected" } } };
let server, client;

const node = (name) => ({
  name, state: name === "b" && draining ? "draining" : "ready", api_url: `http://${name}:7777`, labels: { zone: "a" },
  version: "v1", incarnation: `i-${name}`, started_at: "2026-12-05T02:00:00Z", seen_at: "2026-12-05T03:00:00Z",
  cpus: 2, memory_bytes: 8 << 30, free_memory_bytes: 6 << 30, sandboxes: 1,
});

before(async () => {
  server = createServer((req, res) => {
    requests.push(`${req.method} ${req.url}`);
    const answer = (status, body) => {
      res.writeHead(status, { "Content-Type": "application/json" });
      res.end(typeof body === "string" ? body : JSON.stringify(body));
    };
    const refuse = (status, code, message) => answer(status, { error: { code, message } });
    if (req.url === "/readyz") return answer(readyz.status, readyz.body);
    if (req.headers.authorization !== "Bearer t") return refuse(401, "unauthorized", "no token");
    const path = req.url.split("?")[0];
    if (req.method === "GET" && path === "/nodes") return answer(200, [{ ...node("a"), self: true }, node("b")]);
    if (path === "/nodes/c" || path === "/nodes/c/drain") return refuse(404, "not_found", "no node c in the cluster");
    if (req.method === "GET" && path === "/nodes/b") return answer(200, node("b"));
    if (path === "/nodes/b/drain" && req.method === "POST") {
      draining = true;
      return answer(200, node("b"));
    }
    if (path === "/nodes/b/drain" && req.method === "DELETE") {
      draining = false;
      return answer(200, node("b"));
    }
    if (req.method === "GET" && path === "/sandboxes") return answer(200, [{ id: "b".repeat(64), state: "node_lost", node: "b" }]);
    refuse(404, "not_found", "no route");
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  client = new Client({ url: `http://127.0.0.1:${server.address().port}`, token: "t" });
});

after(async () => {
  await client?.close();
  server?.closeAllConnections?.();
  await new Promise((r) => server.close(r));
});

async function rejects(p, code, status) {
  await assert.rejects(p, (err) => {
    assert.ok(err instanceof SandkilnError, `not a SandkilnError: ${err}`);
    assert.equal(err.code, code, err.message);
    if (status !== undefined) assert.equal(err.status, status);
    return true;
  });
}

test("nodes: list, get, drain and undrain, by the routes kilnd has", async () => {
  requests.length = 0;
  const nodes = await client.nodes.list();
  assert.deepEqual(nodes.map((n) => [n.name, n.state, n.self ?? false]), [["a", "ready", true], ["b", "ready", false]]);
  assert.equal(nodes[1].free_memory_bytes, 6 << 30);
  assert.equal((await client.nodes.get("b")).state, "ready");
  await rejects(client.nodes.get("c"), "NOT_FOUND", 404);
  assert.equal((await client.nodes.drain("b")).state, "draining");
  assert.equal((await client.nodes.get("b")).state, "draining");
  assert.equal((await client.nodes.undrain("b")).state, "ready");
  await rejects(client.nodes.drain("c"), "NOT_FOUND", 404);
  await rejects(client.nodes.get(""), "INVALID_ARGUMENT");
  const listed = await client.sandboxes.list({ node: "b", state: "node_lost" });
  assert.deepEqual(listed.map((s) => [s.node, s.state]), [["b", "node_lost"]]);
  assert.deepEqual(requests, ["GET /nodes", "GET /nodes/b", "GET /nodes/c", "POST /nodes/b/drain", "GET /nodes/b",
    "DELETE /nodes/b/drain", "POST /nodes/c/drain", "GET /sandboxes?state=node_lost&node=b"]);
});

test("ready: the cluster down is an answer; anything else at 503 is an error", async () => {
  assert.deepEqual(await client.ready(), { status: "ok", cluster: { node: "a", state: "connected" } });
  readyz = { status: 503, body: { status: "cluster down", cluster: { node: "a", state: "down" } } };
  assert.deepEqual(await client.ready(), { status: "cluster down", cluster: { node: "a", state: "down" } });
  readyz = { status: 503, body: { error: { code: "unavailable", message: "shutting down" } } };
  await rejects(client.ready(), "UNAVAILABLE", 503);
  readyz = { status: 503, body: "<html>Service Unavailable</html>" };
  await rejects(client.ready(), "INTERNAL", 503);
  readyz = { status: 500, body: { error: { code: "internal", message: "oops" } } };
  await rejects(client.ready(), "INTERNAL", 500);
  readyz = { status: 200, body: {} };
  await rejects(client.ready(), "INTERNAL");
});
