// The seed's three recipes, run as a user would run them, against a real kilnd.

import { test } from "node:test";
import assert from "node:assert/strict";

import { Client } from "../dist/index.js";
import { buildWithProgress, interactiveWorker, serverWorkspace } from "../dist-examples/recipes.js";
import { sandboxSuite } from "./suite.mjs";

let kilnd, client, sandbox;
sandboxSuite((s) => ({ kilnd, client, sandbox } = s));

test("buildWithProgress", async () => {
  const lines = [];
  const { result, tail } = await buildWithProgress(sandbox, (l) => lines.push(l));
  // Each stream in order; the two are read from two pipes, apart.
  const of = (stream) => lines.filter((l) => l.startsWith(stream + ": "));
  assert.deepEqual(of("stdout"), ["stdout: [build] fetch", "stdout: [build] compile", "stdout: [build] link"]);
  assert.deepEqual(of("stderr"), ["stderr: warning: 1 unused"]);
  assert.equal(lines.length, 4);
  assert.deepEqual(tail.lines.map((l) => `${l.stream}: ${l.text}`).sort(), [...lines].sort());
  assert.equal(tail.truncated, false);
  assert.equal(result.exitCode, 0);
  assert.equal(result.outputComplete, true);
});

test("interactiveWorker", async () => {
  const r = await interactiveWorker(sandbox, ["first request", "second request"]);
  assert.deepEqual(r.answers, ["done: FIRST REQUEST", "done: SECOND REQUEST"]);
  assert.equal(r.out.status, "fulfilled");
  assert.equal(r.exit.status, "fulfilled");
  assert.equal(r.exit.value.exitCode, 0);
  assert.ok(["running", "exited"].includes(r.status.state));
});

test("serverWorkspace", async () => {
  const own = new Client({ url: kilnd.url, token: kilnd.token });
  const r = await serverWorkspace(own);
  assert.equal(r.page, "<h1>hello from the sandbox</h1>\n");
  assert.match(r.previewURL, new RegExp(`^http://[0-9a-f]{16}\\.localhost:${new URL(kilnd.url).port}/preview/[\\w-]+/$`));
  assert.deepEqual(r.terminated, { status: "requested" });
  assert.equal(r.exit.signal, "SIGKILL");
  assert.ok(r.logs.some((l) => l.includes("GET / ")), r.logs.join("\n"));
  const left = await client.sandboxes.list();
  assert.deepEqual(left.map((s) => s.id), [sandbox.id]); // its own sandbox destroyed
});
