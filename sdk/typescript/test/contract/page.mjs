// The contract's cases in a browser page: the SDK's dist as the page
// loads it, kilnd reached across origins with the token in the WebSocket's
// subprotocol, as a browser app would. Cases that need a proxy in
// between (a browser page cannot make one) or hold an answer for 30 s are
// not run here; the runner says which.

import { Client } from "../../dist/index.js";
import { cases } from "./cases.mjs";

const params = new URLSearchParams(location.hash.slice(1));
const kilnd = { url: params.get("kilnd"), token: params.get("token") };

async function run() {
  const t = { kilnd, client: new Client({ url: kilnd.url, token: kilnd.token }) };
  t.sandbox = await t.client.sandboxes.create();
  const results = [];
  for (const c of cases) {
    if (c.needs) {
      results.push({ sentence: c.sentence, skipped: c.needs });
      continue;
    }
    const t0 = performance.now();
    try {
      await c.run(t);
      results.push({ sentence: c.sentence, ms: performance.now() - t0 });
    } catch (err) {
      results.push({ sentence: c.sentence, error: `${err?.name}: ${err?.code ? err.code + ": " : ""}${err?.message}\n${err?.stack ?? ""}` });
    }
    document.title = `${results.length}/${cases.length}`;
  }
  await t.sandbox.destroy();
  await t.client.close();
  return results;
}

window.contract = run().catch((err) => [{ sentence: "(setup)", error: String(err?.stack ?? err) }]);
