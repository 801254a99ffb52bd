// The streaming contract's cases (cases.mjs), each a test named by the
// seed's sentence it holds the SDK to, against a real kilnd: on Node 20,
// Node 22, Bun and Deno, whichever runs this file.

import { test, before, after } from "node:test";

import { Client } from "../../dist/index.js";
import { startKilnd } from "../kilnd.mjs";
import { startProxy } from "../proxy.mjs";
import { cases } from "./cases.mjs";

const runtime = globalThis.Deno ? "deno" : globalThis.Bun ? "bun" : `node${process.versions.node.split(".")[0]}`;
// The cases that hold an answer for the seed's 30 s run on one runtime, so
// that the four runs do not each wait for them; said, never skipped silently.
const slowHere = runtime === "node22";

const t = {};
let kilnd, proxy;

before(async () => {
  kilnd = await startKilnd();
  proxy = await startProxy(kilnd.url);
  t.kilnd = { url: kilnd.url, token: kilnd.token };
  t.client = new Client({ url: kilnd.url, token: kilnd.token });
  t.sandbox = await t.client.sandboxes.create();
  t.proxy = proxy;
  t.via = await new Client({ url: proxy.url, token: kilnd.token }).sandboxes.get(t.sandbox.id);
});

after(async () => {
  try {
    await t.sandbox?.destroy();
    await t.client?.close();
    await proxy?.close();
  } finally {
    await kilnd?.stop();
  }
});

const slow = cases.filter((c) => c.needs === "slow");
if (!slowHere) console.log(`# ${slow.length} contract case(s) that hold an answer for 30 s run on Node 22 only: ${slow.map((c) => c.sentence).join(" | ")}`);

for (const c of cases) {
  if (c.needs === "slow" && !slowHere) continue;
  // Deno's runner, given a skipped test, may end the file without its after
  // hook: cases not run here are not defined (and are named above).
  test(`[${c.section}] ${c.sentence}`, { timeout: 180_000 }, () => c.run(t));
}
