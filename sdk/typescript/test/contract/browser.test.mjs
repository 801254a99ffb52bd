// The contract's cases in headless Chromium (Debian's, driven by
// playwright-core), the SDK's browser build against a real kilnd from a
// page of another origin kilnd allows: the browser's own fetch and
// WebSocket, which cannot stop reading, holding kilnd back by credit alone.
// Node only (it drives the browser); Bun and Deno leave it to Node.

import { test, before, after } from "node:test";
import { existsSync, readFileSync } from "node:fs";
import http from "node:http";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";

import { cases } from "./cases.mjs";

const node = !globalThis.Bun && !globalThis.Deno;
const major = node ? Number(process.versions.node.split(".")[0]) : 0;
// Once per suite: on the Node that runs `npm test` (20), not again on 22.
const here = node && major < 22;
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const root = fileURLToPath(new URL("../../", import.meta.url));
const types = { ".mjs": "text/javascript", ".js": "text/javascript", ".html": "text/html", ".map": "application/json" };

let kilnd, server, browser, results;

if (here) {
  before(async () => {
    if (!existsSync(executablePath)) throw new Error(`no Chromium at ${executablePath} (apt-get install chromium, or set CHROMIUM)`);
    // The page and the SDK's files, from an origin of their own.
    server = http.createServer((req, res) => {
      const path = normalize(decodeURIComponent(new URL(req.url, "http://x").pathname));
      if (path === "/") {
        res.writeHead(200, { "Content-Type": "text/html" });
        res.end('<!doctype html><title>contract</title><script type="module" src="/test/contract/page.mjs"></script>');
        return;
      }
      const file = join(root, path);
      if (!file.startsWith(root) || !(path.startsWith("/dist/") || path.startsWith("/test/contract/")) || !existsSync(file)) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { "Content-Type": types[extname(file)] ?? "application/octet-stream" });
      res.end(readFileSync(file));
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    const origin = `http://127.0.0.1:${server.address().port}`;
    const { startKilnd } = await import("../kilnd.mjs");
    kilnd = await startKilnd("--allow-origin", origin);
    const { chromium } = await import("playwright-core");
    browser = await chromium.launch({
      executablePath,
      headless: true,
      // No network but loopback: nothing Chromium reaches for on its own.
      args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
    });
    const page = await browser.newPage();
    const problems = [];
    page.on("pageerror", (e) => problems.push(String(e)));
    await page.goto(`${origin}/#kilnd=${encodeURIComponent(kilnd.url)}&token=${encodeURIComponent(kilnd.token)}`);
    results = page.evaluate(() => window.contract).then((r) => {
      if (problems.length) r.push({ sentence: "(page)", error: problems.join("\n") });
      return r;
    });
    const skipped = cases.filter((c) => c.needs);
    console.log(`# in Chromium, ${cases.length - skipped.length} cases; not run in a page (they need a proxy between it and kilnd, or 30 s held answers): ${skipped.length}`);
  });

  after(async () => {
    try {
      await browser?.close();
      server?.close();
    } finally {
      await kilnd?.stop();
    }
  });

  for (const c of cases.filter((c) => !c.needs)) {
    test(`[chromium] [${c.section}] ${c.sentence}`, { timeout: 600_000 }, async () => {
      const r = (await results).find((x) => x.sentence === c.sentence);
      if (!r) throw new Error("the page gave no result");
      if (r.error) throw new Error(r.error);
    });
  }
  test("[chromium] the page ran without errors of its own", async () => {
    const r = (await results).filter((x) => x.sentence.startsWith("("));
    if (r.length) throw new Error(r.map((x) => x.error).join("\n"));
  });
}
