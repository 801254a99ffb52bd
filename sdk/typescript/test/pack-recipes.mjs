// Copied into the project pack.mjs installs the packed SDK into, beside
// the recipes compiled there against it: runs the three recipes as a user
// would, with the package as a user gets it. Prints "recipes: ok".

import assert from "node:assert/strict";

import { Client } from "@sandkiln/sdk";
import { buildWithProgress, interactiveWorker, serverWorkspace } from "./out/recipes.js";

const client = new Client();
const sandbox = await client.sandboxes.create();
try {
  const lines = [];
  const build = await buildWithProgress(sandbox, (l) => lines.push(l));
  // Each stream in order; the two are read from two pipes, apart.
  const of = (stream) => lines.filter((l) => l.startsWith(stream + ": "));
  assert.deepEqual(of("stdout"), ["stdout: [build] fetch", "stdout: [build] compile", "stdout: [build] link"]);
  assert.deepEqual(of("stderr"), ["stderr: warning: 1 unused"]);
  assert.equal(lines.length, 4);
  assert.deepEqual([build.result.exitCode, build.result.outputComplete], [0, true]);
  assert.equal(build.tail.lines.length, 4);

  const worker = await interactiveWorker(sandbox, ["first request", "second request"]);
  assert.deepEqual(worker.answers, ["done: FIRST REQUEST", "done: SECOND REQUEST"]);
  assert.deepEqual([worker.out.status, worker.exit.status, worker.exit.value?.exitCode], ["fulfilled", "fulfilled", 0]);

  const server = await serverWorkspace(new Client());
  assert.equal(server.page, "<h1>hello from the sandbox</h1>\n");
  assert.deepEqual(server.terminated, { status: "requested" });
  assert.equal(server.exit.signal, "SIGKILL");
  assert.ok(server.logs.some((l) => l.includes("GET / ")), server.logs.join("\n"));
} finally {
  await sandbox.destroy();
  await client.close();
}
console.log("recipes: ok");
