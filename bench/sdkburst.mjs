// One stream-mode read of a burst through the TypeScript SDK, for the
// benchmark's sdk section: starts `head -c SIZE /dev/zero` in the sandbox
// SANDBOX of kilnd at KILN_ADDR (token KILN_TOKEN), reads its output in
// bytes, and prints {"bytes":N,"ms":T}: T from the start request to the
// output's end. Any runtime that runs the SDK runs this file.

import { Client } from "../sdk/typescript/dist/index.js";

const env = globalThis.Deno ? (k) => globalThis.Deno.env.get(k) : (k) => process.env[k];
const size = Number(env("SIZE"));
const client = new Client({ url: env("KILN_ADDR"), token: env("KILN_TOKEN") });
const sandbox = await client.sandboxes.get(env("SANDBOX"));
const t0 = performance.now();
const child = await sandbox.processes.start({
  command: { kind: "argv", argv: ["head", "-c", String(size), "/dev/zero"] },
  output: { mode: "stream", format: "bytes" },
});
let bytes = 0;
for await (const c of child.output()) bytes += c.bytes.length;
const ms = performance.now() - t0;
const r = await child.wait();
await child.detach();
await client.close();
console.log(JSON.stringify({ bytes, ms, complete: r.outputComplete }));
