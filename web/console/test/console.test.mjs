// The web console in headless Chromium against a real kilnd: log in, make
// a sandbox, run a command and read its lines and exit, type into a
// terminal, see a gap with its exact count, reload and see the same log,
// with nothing the page's policy refused; and a hostile preview page
// beside it, which reaches neither the console's token, nor the API, nor
// another preview. Screenshots of each state go to test/artifacts/.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { chromium } from "playwright-core";

import { startKilnd } from "../../../sdk/typescript/test/kilnd.mjs";

const artifacts = fileURLToPath(new URL("./artifacts/", import.meta.url));
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";

let kilnd, browser, page;
const pages = {};
const problems = []; // what the page said went wrong: policy refusals, errors
const urls = []; // every URL the console's page asked for, its WebSockets' among them

async function api(method, path, body) {
  const resp = await fetch(kilnd.url + path, {
    method,
    headers: { Authorization: "Bearer " + kilnd.token, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  assert.ok(resp.ok, `${method} ${path}: ${resp.status} ${await resp.clone().text()}`);
  return resp.status === 204 ? undefined : resp.json();
}

async function shot(name) {
  await page.screenshot({ path: artifacts + name + ".png", fullPage: true });
}

before(async () => {
  assert.ok(existsSync(executablePath), `no Chromium at ${executablePath} (apt-get install chromium, or set CHROMIUM)`);
  mkdirSync(artifacts, { recursive: true });
  // Two pages of other origins: one kilnd allows, one it does not.
  for (const name of ["allowed", "foreign"]) {
    const server = http.createServer((req, res) => {
      res.writeHead(200, { "Content-Type": "text/html" });
      res.end(`<!doctype html><title>${name}</title>`);
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    pages[name] = { server, origin: `http://127.0.0.1:${server.address().port}` };
  }
  kilnd = await startKilnd("--allow-origin", pages.allowed.origin);
  browser = await chromium.launch({
    executablePath,
    headless: true,
    // No network but kilnd's loopback: nothing Chromium reaches for on its
    // own, and no name resolved but localhost's, which Chromium resolves
    // to loopback itself (the previews' ID.localhost among them).
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
      "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE *.localhost, EXCLUDE 127.0.0.1"],
  });
  // A context of its own, which the previews' pages share with it.
  page = await (await browser.newContext({ viewport: { width: 1280, height: 1000 } })).newPage();
  page.on("console", (m) => {
    if (m.type() === "error" || /Content Security Policy/i.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("response", (r) => { if (r.status() >= 400) problems.push(`answer: ${r.status()} ${r.request().method()} ${r.url()}`); });
  page.on("request", (r) => urls.push(r.url()));
  page.on("websocket", (ws) => urls.push(ws.url()));
  page.on("framenavigated", (f) => urls.push(f.url()));
});

after(async () => {
  for (const p of Object.values(pages)) p.server.close();
  await browser?.close();
  await kilnd?.stop();
});

test("the console, as a user uses it", async () => {
  const resp = await page.goto(kilnd.url + "/");
  assert.match(resp.headers()["content-security-policy"], /script-src 'self'; style-src 'self' 'nonce-/);
  await page.waitForSelector("#login");
  await shot("01-login");

  // A wrong token is told so; the right one logs in.
  await page.fill("#token", "wrong");
  await page.click("#login button[type=submit]");
  await page.waitForSelector("#login .error");
  problems.length = 0; // the refused token's 401 is the browser's to log
  await page.fill("#token", kilnd.token);
  await page.click("#login button[type=submit]");
  await page.waitForSelector("text=Log out");
  // Kept in sessionStorage (not localStorage), and in no URL.
  assert.deepEqual(await page.evaluate(() => ({ session: sessionStorage.getItem("kiln.token"), local: localStorage.getItem("kiln.token") })),
    { session: kilnd.token, local: null });
  assert.ok(!page.url().includes(kilnd.token), "the token is in the URL");

  // A sandbox.
  await page.click("#create button[type=submit]");
  // The list is drawn again as kilnd's events come (its creation among
  // them): the row is found by its sandbox at each step, not held.
  const sb = await page.locator("tr[data-sandbox]").first().getAttribute("data-sandbox");
  await page.locator(`tr[data-sandbox="${sb}"]`).locator("text=Open").click();
  await page.waitForSelector("#start");
  await shot("02-sandbox");

  // The seed's command: three lines, then the exit.
  await page.fill("#start input[name=command]", "for i in 1 2 3; do echo line-$i; sleep 1; done");
  await page.click("#start button[type=submit]");
  await page.waitForSelector("#log .exit", { timeout: 30_000 });
  assert.equal(await page.textContent("#log"), "line-1\nline-2\nline-3\n[process exited with code 0]\n");
  assert.match(await page.textContent("#log-summary"), /stdout: 21 bytes · stderr: 0 bytes · complete/);
  await shot("03-log");

  // A reload shows the same log, replayed.
  await page.reload();
  await page.waitForSelector("#log .exit", { timeout: 30_000 });
  assert.equal(await page.textContent("#log"), "line-1\nline-2\nline-3\n[process exited with code 0]\n");
  await shot("04-reloaded");

  // stdout and stderr told apart.
  await page.fill("#start input[name=command]", "echo out; echo err >&2");
  await page.click("#start button[type=submit]");
  // The new process's log, ended: not the last one's, still shown until
  // the page has switched to it.
  await page.waitForFunction(() => {
    const log = document.querySelector("#log");
    return log && !log.textContent.includes("line-1") && log.querySelector(".exit");
  });
  assert.equal(await page.textContent("#log .stdout"), "out\n");
  assert.equal(await page.textContent("#log .stderr"), "err\n");

  // kilnd restarted mid-follow: the page resumes from the offsets it had,
  // every line once.
  await page.fill("#start input[name=command]", "i=0; while [ $i -lt 15 ]; do i=$((i+1)); echo n-$i; sleep 0.2; done");
  await page.click("#start button[type=submit]");
  await page.waitForFunction(() => document.querySelector("#log")?.textContent.includes("n-3\n"));
  await kilnd.restart();
  await page.waitForSelector("#log .exit", { timeout: 30_000 });
  let want = "";
  for (let i = 1; i <= 15; i++) want += `n-${i}\n`;
  assert.equal(await page.textContent("#log"), want + "[process exited with code 0]\n");
  await shot("05-resumed");
  // What the browser said while kilnd was away is not a problem.
  const away = problems.filter((p) => !/ERR_CONNECTION_REFUSED|ERR_EMPTY_RESPONSE|WebSocket connection to/.test(p));
  problems.splice(0, problems.length, ...away);

  // A terminal: type, read it back.
  await page.fill("#start input[name=command]", "");
  await page.check("#start-terminal");
  await page.click("#start button[type=submit]");
  await page.waitForSelector("#terminal .xterm-rows");
  await page.click("#terminal");
  await page.keyboard.type("echo h''i\n");
  await page.waitForFunction(() => [...document.querySelectorAll("#terminal .xterm-rows > div")].some((r) => r.textContent.trim() === "hi"),
    null, { timeout: 15_000 });
  await shot("06-terminal");
  await page.keyboard.type("exit\n");
  await page.waitForFunction(() => document.querySelector("#log-summary")?.textContent?.includes("terminal:"), null, { timeout: 15_000 });
  await page.uncheck("#start-terminal");

  // A 4 MiB burst nobody watched: the ring kept its last MiB, and the
  // console says exactly how much was lost.
  const total = 4 << 20;
  const st = await api("POST", `/sandboxes/${sb}/exec-stream`, { command: "sh", args: ["-c", `head -c ${total} /dev/zero | tr '\\0' a`] });
  await api("GET", `/sandboxes/${sb}/exec-stream/${st.id}/wait`);
  await page.goto(`${kilnd.url}/#sandbox=${sb}&process=${st.id}`);
  await page.reload();
  await page.waitForSelector("#log .exit", { timeout: 30_000 });
  const got = await page.evaluate(() => ({
    lost: [...document.querySelectorAll("#log .gap")].reduce((n, g) => n + Number(g.getAttribute("data-lost")), 0),
    gap: document.querySelector("#log .gap")?.textContent,
    delivered: [...document.querySelectorAll("#log .stdout")].reduce((n, s) => n + s.textContent.length, 0),
    summary: document.querySelector("#log-summary")?.textContent,
  }));
  assert.ok(got.lost > 0, JSON.stringify(got));
  assert.equal(got.delivered + got.lost, total);
  assert.equal(got.gap, `[${got.lost} bytes of stdout lost]\n`);
  assert.match(got.summary, new RegExp(`stdout: ${total} bytes, ${got.lost} lost`));
  await shot("07-gap");

  // Files: upload one, see it listed, download it.
  await page.setInputFiles("#files input[type=file]", { name: "notes.txt", mimeType: "text/plain", buffer: Buffer.from("from the browser\n") });
  await page.waitForSelector('#files tr[data-file="notes.txt"]');
  const [download] = await Promise.all([page.waitForEvent("download"), page.click('#files tr[data-file="notes.txt"] >> text=Download')]);
  const saved = artifacts + "notes.txt";
  await download.saveAs(saved);
  assert.equal(readFileSync(saved, "utf8"), "from the browser\n");
  assert.equal(await (await fetch(`${kilnd.url}/sandboxes/${sb}/files/workspace/notes.txt`, { headers: { Authorization: "Bearer " + kilnd.token } })).text(), "from the browser\n");
  await shot("08-files");

  assert.deepEqual(problems, [], "the page reported problems");
});

test("another origin's page: CORS for the one kilnd allows, none for the other; the token protocol alone", async () => {
  const sb = (await api("GET", "/sandboxes"))[0].id;
  const st = await api("POST", `/sandboxes/${sb}/exec-stream`, { command: "echo", args: ["raw"] });
  await api("GET", `/sandboxes/${sb}/exec-stream/${st.id}/wait`);
  const other = await browser.newPage();
  const call = (origin) => other.goto(origin).then(() => other.evaluate(async ({ url, token }) => {
    try {
      const r = await fetch(url + "/sandboxes", { method: "GET", headers: { Authorization: "Bearer " + token, "Content-Type": "application/json" } });
      return { status: r.status, ids: (await r.json()).map((s) => s.id) };
    } catch (err) {
      return { error: String(err) };
    }
  }, { url: kilnd.url, token: kilnd.token }));
  // The preflight (Authorization and a JSON type are not simple) is answered without the token.
  assert.deepEqual(await call(pages.allowed.origin), { status: 200, ids: [sb] });
  const refused = await call(pages.foreign.origin);
  assert.match(refused.error ?? "", /TypeError/, JSON.stringify(refused));

  // A browser's WebSocket offering only kiln.token.TOKEN opens, and speaks kiln.raw.
  await other.goto(pages.allowed.origin);
  const raw = await other.evaluate(({ url, token }) => new Promise((resolve) => {
    const ws = new WebSocket(url, ["kiln.token." + token]);
    ws.binaryType = "arraybuffer";
    let text = "";
    ws.onmessage = (ev) => { text += typeof ev.data === "string" ? ev.data : new TextDecoder().decode(ev.data); };
    ws.onclose = (ev) => resolve({ protocol: ws.protocol, text, code: ev.code });
    ws.onerror = () => {};
  }), { url: `${kilnd.url.replace("http", "ws")}/sandboxes/${sb}/exec-stream/${st.id}/logs`, token: kilnd.token });
  assert.deepEqual(raw, { protocol: "kiln.token." + kilnd.token, text: "raw\n[process exited with code 0]\n", code: 1000 });
  // From the foreign origin the WebSocket is refused.
  await other.goto(pages.foreign.origin);
  const foreign = await other.evaluate((url) => new Promise((resolve) => {
    const ws = new WebSocket(url);
    ws.onopen = () => resolve("open");
    ws.onclose = (ev) => resolve(`closed ${ev.code}`);
  }), `${kilnd.url.replace("http", "ws")}/sandboxes/${sb}/exec-stream/${st.id}/logs`);
  assert.equal(foreign, "closed 1006");
  await other.close();
});

/** Opens sandbox id's page, as a reload of its URL would. */
async function openSandbox(id) {
  await page.goto(`${kilnd.url}/#sandbox=${id}`);
  await page.reload();
  await page.waitForSelector(`#sandbox[data-sandbox="${id}"] .sandbox-state`);
}

/** The process the page has open (its URL's fragment names it). */
const openProcessId = () => page.evaluate(() => new URLSearchParams(location.hash.slice(1)).get("process"));

test("sandboxes: state and limits as kilnd has them; Pause and Resume; Delete takes one off the list and out of kilnd", async () => {
  await page.goto(kilnd.url + "/");
  await page.waitForSelector("text=Log out");
  const before = new Set((await api("GET", "/sandboxes")).map((s) => s.id));
  await page.fill("#create input[name=memory]", "256");
  await page.fill("#create input[name=cpus]", "0.5");
  await page.fill("#create input[name=pids]", "64");
  await page.click("#create button[type=submit]");
  const id = await page.waitForFunction((known) => [...document.querySelectorAll("tr[data-sandbox]")]
    .map((r) => r.getAttribute("data-sandbox")).find((s) => !known.includes(s)), [...before]).then((h) => h.jsonValue());
  const info = await api("GET", `/sandboxes/${id}`);
  assert.deepEqual([info.limits.memory_bytes, info.limits.cpus, info.limits.pids], [256 << 20, 0.5, 64]);
  const row = page.locator(`tr[data-sandbox="${id}"]`);
  assert.equal(await row.locator("td.state").textContent(), info.state);
  assert.equal(info.state, "running");
  assert.match(await row.locator("td.limits").textContent(), /^256 MiB, 0\.5 CPU, 64 pids(, \d+ GiB disk)?$/);
  await row.locator("text=Open").click();
  await page.waitForSelector(`#sandbox[data-sandbox="${id}"]`);
  assert.equal(await page.textContent("#sandbox .sandbox-state"), "running");
  assert.match(await page.textContent("#sandbox p"), /^State: running · 256 MiB, 0\.5 CPU, 64 pids/);
  await shot("09-limits");

  // Paused and resumed as docker pause and unpause do: the row, and the
  // open panel, say so.
  await row.locator("text=Pause").click();
  await row.locator("td.state >> text=paused").waitFor();
  assert.equal((await api("GET", `/sandboxes/${id}`)).state, "paused");
  await page.waitForSelector("#sandbox .sandbox-state >> text=paused");
  await row.locator("text=Resume").click();
  await row.locator("td.state >> text=running").waitFor();
  assert.equal((await api("GET", `/sandboxes/${id}`)).state, "running");

  // A snapshot of its files, and a fork with them: a new row, its files
  // the sandbox's.
  await api("POST", `/sandboxes/${id}/exec`, { command: "sh", args: ["-c", "echo forked > /workspace/f"] });
  const [taken] = await Promise.all([
    page.waitForResponse((r) => r.request().method() === "POST" && r.url().endsWith(`/sandboxes/${id}/snapshots`)),
    row.locator("text=Snapshot").click(),
  ]);
  assert.equal(taken.status(), 201);
  assert.equal((await api("GET", `/snapshots?sandbox=${id}`)).length, 1);
  const listed = new Set(await page.$$eval("tr[data-sandbox]", (rs) => rs.map((r) => r.getAttribute("data-sandbox"))));
  await row.locator("text=Fork").click();
  const fork = await page.waitForFunction((known) => [...document.querySelectorAll("tr[data-sandbox]")]
    .map((r) => r.getAttribute("data-sandbox")).find((s) => !known.includes(s)), [...listed]).then((h) => h.jsonValue());
  const read = await api("POST", `/sandboxes/${fork}/exec`, { command: "cat", args: ["/workspace/f"] });
  assert.equal(read.stdout, "forked\n");
  for (const s of await api("GET", `/snapshots?sandbox=${id}`)) await api("DELETE", `/snapshots/${s.id}`);
  await api("DELETE", `/sandboxes/${fork}?remove_logs=true`);

  await row.locator("text=Delete").click();
  await page.waitForSelector(`tr[data-sandbox="${id}"]`, { state: "detached" });
  assert.ok(!(await api("GET", "/sandboxes")).some((s) => s.id === id), "kilnd still has it");
  assert.equal(await page.$(`#sandbox[data-sandbox="${id}"]`), null, "its panel stayed open");
  assert.equal(await page.$("#sandbox .sandbox-state"), null, "its panel stayed open");
  // The others are left alone.
  const now = new Set((await page.$$eval("tr[data-sandbox]", (rs) => rs.map((r) => r.getAttribute("data-sandbox")))));
  assert.deepEqual(now, before);
});

test("nodes: none shown on one kilnd; in a cluster's answers, each sandbox's node in its row and its panel, at any width", async () => {
  const sb = await api("POST", "/sandboxes", { name: "placed" });
  const row = page.locator(`tr[data-sandbox="${sb.id}"]`);
  // Logged in as a reload finds it, whichever test ran before.
  await page.goto(kilnd.url + "/");
  await page.evaluate((t) => sessionStorage.setItem("kiln.token", t), kilnd.token);
  await page.reload();
  await row.waitFor();
  assert.equal(await row.locator("td.state").textContent(), "running");
  assert.equal(await row.locator(".node").count(), 0, "a node on a kilnd in no cluster");
  // kilnd's answers as a clustered kilnd gives them: each sandbox names
  // its node. No cluster is started; the page cannot tell.
  const onNode = async (route) => {
    if (route.request().method() !== "GET") return route.continue();
    const resp = await route.fetch();
    const body = await resp.json();
    const node = "eu-west-1a-node-07"; // a long name, as a host's can be
    await route.fulfill({ response: resp, json: Array.isArray(body) ? body.map((s) => ({ ...s, node })) : { ...body, node } });
  };
  const sandboxes = /\/sandboxes(\/[0-9a-f]{64})?(\?.*)?$/;
  await page.route(sandboxes, onNode);
  try {
    for (const width of [360, 1280]) {
      await page.setViewportSize({ width, height: 900 });
      await page.goto(`${kilnd.url}/#sandbox=${sb.id}`);
      await page.reload();
      await row.locator("td.state .node >> text=on eu-west-1a-node-07").waitFor();
      assert.equal(await row.locator("td.state").evaluate((td) => td.firstChild.textContent), "running");
      await page.waitForSelector(`#sandbox[data-sandbox="${sb.id}"] .sandbox-node`);
      assert.match(await page.textContent("#sandbox p"), /^State: running · .* · node eu-west-1a-node-07$/);
      await shot(`19-nodes-${width}`);
      await laidOut(width);
    }
  } finally {
    await page.setViewportSize({ width: 1280, height: 1000 });
    await page.unroute(sandboxes, onNode);
    await api("DELETE", `/sandboxes/${sb.id}?remove_logs=true`);
  }
});

/** Asserts that at width px nothing scrolls sideways and no two controls overlap. */
async function laidOut(width) {
  const over = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(over <= 0, `${width} px: the page scrolls ${over} px sideways`);
  const boxes = await page.$$eval("button, input, select, a", (els) => els
    .filter((e) => e.offsetParent !== null)
    .map((e) => { const r = e.getBoundingClientRect(); return { what: e.outerHTML.slice(0, 60), l: r.left, t: r.top, r: r.right, b: r.bottom }; })
    .filter((r) => r.r > r.l && r.b > r.t));
  for (let i = 0; i < boxes.length; i++) {
    const a = boxes[i];
    assert.ok(a.r <= width + 0.5, `${width} px: ${a.what} ends at ${a.r}`);
    for (let j = i + 1; j < boxes.length; j++) {
      const b = boxes[j];
      const overlap = Math.min(a.r, b.r) - Math.max(a.l, b.l) > 1 && Math.min(a.b, b.b) - Math.max(a.t, b.t) > 1;
      assert.ok(!overlap, `${width} px: ${a.what} overlaps ${b.what}`);
    }
  }
}

test("widths: at 360, 768 and 1280 px nothing scrolls sideways and no two controls overlap; names and labels shown", async () => {
  const sb = await api("POST", "/sandboxes", { name: "narrow", labels: { team: "web" } });
  // A process, so that its row (exit, bytes per stream) is laid out too.
  const ran = await api("POST", `/sandboxes/${sb.id}/exec-stream`, { command: "sh", args: ["-c", "echo a-longer-line-of-output; echo oops >&2; exit 2"] });
  await api("GET", `/sandboxes/${sb.id}/exec-stream/${ran.id}/wait`);
  try {
    for (const width of [360, 768, 1280]) {
      await page.setViewportSize({ width, height: 900 });
      await page.goto(kilnd.url + "/#sandbox=" + sb.id);
      await page.reload(); // a new fragment alone loads nothing
      await page.waitForSelector(`#sandbox[data-sandbox="${sb.id}"]`);
      await page.waitForSelector(`#processes tr[data-process="${ran.id}"] td.exit >> text=2`);
      await page.waitForSelector(`#events-list li[data-type="process.exited"]`);
      const row = page.locator(`tr[data-sandbox="${sb.id}"]`);
      assert.equal(await row.locator("td.name").textContent(), "narrow");
      if (width >= 768) assert.equal(await row.locator("td.labels").textContent(), "team=web");
      await shot(`20-width-${width}`);
      await laidOut(width);
    }
  } finally {
    await page.setViewportSize({ width: 1280, height: 1000 });
    // Deleted as a user does, so that the page, which has it open, is not
    // left asking for it.
    await page.locator(`tr[data-sandbox="${sb.id}"]`).locator("text=Delete").click();
    await page.waitForSelector(`tr[data-sandbox="${sb.id}"]`, { state: "detached" });
  }
});

test("processes: TERM and Kill on a running process, the exit shown as its signal", async () => {
  const sb = (await api("POST", "/sandboxes", {})).id;
  await openSandbox(sb);
  const start = async (command) => {
    const was = await openProcessId();
    await page.fill("#start input[name=command]", command);
    await page.click("#start button[type=submit]");
    await page.waitForFunction((was) => {
      const p = new URLSearchParams(location.hash.slice(1)).get("process");
      return p && p !== was;
    }, was);
    const id = await openProcessId();
    await page.waitForSelector(`#processes tr[data-process="${id}"] >> text=TERM`);
    return id;
  };
  const press = async (id, label, path) => {
    const answered = page.waitForResponse((r) => r.url().includes(`/exec-stream/${id}${path}`) && r.request().method() !== "GET");
    await page.locator(`#processes tr[data-process="${id}"]`).getByRole("button", { name: label, exact: true }).click();
    assert.ok((await answered).ok());
  };

  // A process that heeds SIGTERM ends by it.
  const heeds = await start("sleep 300");
  await press(heeds, "TERM", "/signal");
  await page.waitForSelector("#log .exit", { timeout: 15_000 });
  assert.equal(await page.textContent("#log .exit"), "[process killed by signal SIGTERM]\n");
  assert.equal((await api("GET", `/sandboxes/${sb}/exec-stream/${heeds}`)).signal, "TERM");
  await page.waitForFunction((id) => document.querySelector(`#processes tr[data-process="${id}"] td.exit`)?.textContent === "143 SIGTERM", heeds);
  const exited = page.locator(`#processes tr[data-process="${heeds}"]`);
  assert.equal(await exited.locator("td.state").textContent(), "exited");
  assert.equal(await exited.locator("td.exit").getAttribute("title"), "process killed by signal SIGTERM");

  // One that ignores it runs on, until Kill.
  const ignores = await start("trap '' TERM; echo ready; while :; do sleep 1; done");
  await page.waitForFunction(() => document.querySelector("#log")?.textContent.includes("ready\n"));
  await press(ignores, "TERM", "/signal");
  assert.equal((await api("GET", `/sandboxes/${sb}/exec-stream/${ignores}`)).state, "running");
  assert.equal(await page.$("#log .exit"), null);
  await press(ignores, "Kill", "");
  await page.waitForSelector("#log .exit", { timeout: 15_000 });
  assert.equal(await page.textContent("#log .exit"), "[process killed by signal SIGKILL]\n");
  assert.equal((await api("GET", `/sandboxes/${sb}/exec-stream/${ignores}`)).signal, "KILL");
  await page.waitForFunction((id) => document.querySelector(`#processes tr[data-process="${id}"] td.exit`)?.textContent === "137 SIGKILL", ignores);
  const offered = page.locator(`#processes tr[data-process="${ignores}"]`).getByRole("button");
  assert.deepEqual(await offered.allTextContents(), ["Logs"], "an exited process still offers TERM or Kill");
  await shot("10-signals");
  await api("DELETE", `/sandboxes/${sb}`);
});

test("terminal: a narrower window resizes the terminal, and stty size says so", async () => {
  const sb = (await api("POST", "/sandboxes", {})).id;
  await openSandbox(sb);
  await page.fill("#start input[name=command]", "");
  await page.check("#start-terminal");
  // The size the page sends once the terminal is open.
  const resized = () => page.waitForRequest((r) => r.url().endsWith("/resize") && r.method() === "POST").then((r) => r.postDataJSON());
  const first = resized();
  await page.click("#start button[type=submit]");
  await page.waitForSelector("#terminal .xterm-rows");
  const size = await first;
  const rowsShown = await page.$$eval("#terminal .xterm-rows > div", (rs) => rs.length);
  assert.equal(size.rows, rowsShown);
  const stty = async (mark) => {
    await page.click("#terminal");
    await page.keyboard.type(`echo ${mark}-$(stty size)\n`);
    const h = await page.waitForFunction((m) => [...document.querySelectorAll("#terminal .xterm-rows > div")]
      .map((r) => r.textContent.trim()).find((t) => new RegExp(`^${m}-\\d+\\s\\d+$`).test(t)), mark, { timeout: 15_000 });
    const [rows, cols] = (await h.jsonValue()).split("-")[1].split(/\s/).map(Number);
    return { rows, cols };
  };
  assert.deepEqual(await stty("one"), { rows: size.rows, cols: size.cols });

  const next = resized();
  await page.setViewportSize({ width: 800, height: 1000 });
  const smaller = await next;
  assert.ok(smaller.cols < size.cols, `${JSON.stringify(smaller)} after ${JSON.stringify(size)}`);
  assert.equal(smaller.rows, await page.$$eval("#terminal .xterm-rows > div", (rs) => rs.length));
  assert.deepEqual(await stty("two"), { rows: smaller.rows, cols: smaller.cols });
  await shot("11-resized");

  // The wider size answered before the shell ends, which would refuse it.
  const widened = page.waitForResponse((r) => r.url().endsWith("/resize") && r.request().method() === "POST");
  await page.setViewportSize({ width: 1280, height: 1000 });
  assert.equal((await widened).status(), 204);
  // The page reads the process list again once the process has ended:
  // answered before the sandbox is deleted, or it would be a 404.
  const list = new URL(`/sandboxes/${sb}/exec-stream`, kilnd.url).href;
  const relisted = page.waitForResponse((r) => r.url() === list && r.request().method() === "GET", { timeout: 15_000 });
  await page.keyboard.type("exit\n");
  await page.waitForFunction(() => document.querySelector("#log-summary")?.textContent?.includes("terminal:"), null, { timeout: 15_000 });
  await relisted;
  await page.uncheck("#start-terminal");
  await api("DELETE", `/sandboxes/${sb}`);
});

test("files: a subdirectory opened, its file listed and downloaded, and back up", async () => {
  const sb = (await api("POST", "/sandboxes", {})).id;
  const auth = { Authorization: "Bearer " + kilnd.token };
  const put = await fetch(`${kilnd.url}/sandboxes/${sb}/files/workspace/sub/inner.txt`, { method: "PUT", headers: auth, body: "in sub\n" });
  assert.ok(put.ok, String(put.status));
  await openSandbox(sb);
  await page.click("#files >> text=List");
  const dir = page.locator('#files tr[data-file="sub"]');
  await dir.getByRole("button", { name: "sub/" }).click();
  await page.waitForSelector('#files tr[data-file="inner.txt"]');
  assert.equal(await page.inputValue("#files input[name=path]"), "/workspace/sub");
  assert.equal(await page.locator('#files tr[data-file="inner.txt"] td').nth(1).textContent(), "7");
  assert.equal(await page.$('#files tr[data-file="sub"]'), null, "the parent's entries are still shown");
  const [download] = await Promise.all([page.waitForEvent("download"), page.click('#files tr[data-file="inner.txt"] >> text=Download')]);
  const saved = artifacts + "inner.txt";
  await download.saveAs(saved);
  assert.equal(readFileSync(saved, "utf8"), "in sub\n");
  await shot("12-subdirectory");
  await page.locator("#files").getByRole("button", { name: "..", exact: true }).click();
  await page.waitForSelector('#files tr[data-file="sub"]');
  assert.equal(await page.inputValue("#files input[name=path]"), "/workspace");
  assert.equal(await page.$('#files tr[data-file="inner.txt"]'), null);
  await api("DELETE", `/sandboxes/${sb}`);
});

test("events: a sandbox made, stopped and deleted elsewhere, and a process run in the open sandbox, shown as they happen", async () => {
  const sb = (await api("POST", "/sandboxes", {})).id;
  await openSandbox(sb);
  await page.waitForSelector('#events[data-state="live"]');
  // A reload would lose this: the page must change without one.
  await page.evaluate(() => { window.notReloaded = true; });

  // Made through the API, not the page: its row comes with its event.
  const other = await api("POST", "/sandboxes", { name: "made-elsewhere", labels: { by: "api" } });
  const row = page.locator(`tr[data-sandbox="${other.id}"]`);
  await row.locator("td.name >> text=made-elsewhere").waitFor();
  assert.equal(await row.locator("td.state").textContent(), "running");
  await page.waitForSelector(`#events-list li[data-type="sandbox.created"][data-sandbox="${other.id}"]`);

  // A process in the open sandbox: its row appears running, then its exit
  // code and bytes once its stdin is closed.
  const st = await api("POST", `/sandboxes/${sb}/exec-stream`, { command: "sh", args: ["-c", "read line; printf abcde; printf xy >&2; exit 3"], stdin: "pipe" });
  const proc = page.locator(`#processes tr[data-process="${st.id}"]`);
  await page.waitForSelector(`#processes tr[data-process="${st.id}"][data-state="running"]`);
  assert.equal(await proc.locator("td.command").textContent(), "sh -c read line; printf abcde; printf xy >&2; exit 3");
  assert.equal(await proc.locator("td.exit").textContent(), "");
  await api("POST", `/sandboxes/${sb}/exec-stream/${st.id}/stdin/close`);
  await page.waitForSelector(`#processes tr[data-process="${st.id}"][data-state="exited"]`, { timeout: 30_000 });
  assert.equal(await proc.locator("td.exit").textContent(), "3");
  assert.deepEqual(await proc.locator("td.bytes .stream").evaluateAll((els) => els.map((e) => [e.dataset.stream, e.dataset.bytes, e.textContent])),
    [["stdout", "5", "stdout 5 B"], ["stderr", "2", "stderr 2 B"]]);
  const told = page.locator(`#events-list li[data-type="process.exited"][data-sandbox="${sb}"]`).first();
  assert.match(await told.textContent(), /: exit 3, stdout 5 B, stderr 2 B$/);
  await shot("15-events");

  // Stopped, then deleted elsewhere: its state, then its row gone.
  await api("POST", `/sandboxes/${other.id}/stop`, {});
  await row.locator("td.state >> text=stopped").waitFor();
  await api("DELETE", `/sandboxes/${other.id}`);
  await row.waitFor({ state: "detached" });
  // The open sandbox deleted elsewhere: its panel closes, and nothing more is asked of it.
  await api("DELETE", `/sandboxes/${sb}`);
  await page.waitForSelector("#sandbox:not([data-sandbox])");
  assert.equal(await page.$(`tr[data-sandbox="${sb}"]`), null);
  assert.equal(await page.evaluate(() => window.notReloaded), true, "the page was loaded again");
  for (const type of ["sandbox.stopped", "sandbox.deleted"]) {
    await page.waitForSelector(`#events-list li[data-type="${type}"][data-sandbox="${other.id}"]`);
  }
});

test("events: a connection that drops is taken up from the last event seen, none missed, none twice", async () => {
  const tab = await page.context().newPage();
  const said = [];
  tab.on("console", (m) => { if (m.type() === "error") said.push(m.text()); });
  tab.on("pageerror", (e) => said.push(e.message));
  // Every events WebSocket the page opens, passed to kilnd unless held:
  // a held one is closed at once, as by a kilnd that cannot be reached.
  const sockets = [];
  let hold = false;
  await tab.routeWebSocket(/\/events\?/, (ws) => {
    const s = { url: new URL(ws.url()), ws };
    sockets.push(s);
    if (hold) ws.close({ code: 4002, reason: "held by the test" });
    else s.server = ws.connectToServer();
  });
  await tab.goto(kilnd.url + "/");
  await tab.fill("#token", kilnd.token);
  await tab.click("#login button[type=submit]");
  await tab.waitForSelector('#events[data-state="live"]');
  // First those held (follow=false), then the following, from the last of them.
  assert.equal(sockets[0].url.searchParams.get("follow"), "false");
  assert.equal(sockets[0].url.searchParams.get("after"), "0");
  assert.equal(sockets[1].url.searchParams.get("follow"), null);
  const epoch = sockets[1].url.searchParams.get("epoch");
  assert.ok(epoch, sockets[1].url.href);

  const a = (await api("POST", "/sandboxes", {})).id;
  await tab.waitForSelector(`#events-list li[data-type="sandbox.created"][data-sandbox="${a}"]`);
  const last = Math.max(...await tab.$$eval("#events-list li", (lis) => lis.map((li) => Number(li.dataset.seq))));

  // The connection drops, and stays away while things happen.
  hold = true;
  const live = sockets.at(-1);
  await live.ws.close({ code: 4001, reason: "dropped by the test" });
  await live.server.close();
  await tab.waitForSelector('#events[data-state="down"]');
  const b = (await api("POST", "/sandboxes", { name: "while-away" })).id;
  await api("DELETE", `/sandboxes/${a}`);
  hold = false;

  await tab.waitForSelector(`tr[data-sandbox="${b}"]`, { timeout: 30_000 });
  await tab.waitForSelector(`tr[data-sandbox="${a}"]`, { state: "detached" });
  await tab.waitForSelector(`#events-list li[data-type="sandbox.deleted"][data-sandbox="${a}"]`);
  // Each attempt since the drop asked for those after the last seen.
  assert.ok(sockets.length > 2);
  for (const s of sockets.slice(2)) {
    assert.deepEqual([s.url.searchParams.get("after"), s.url.searchParams.get("epoch"), s.url.searchParams.get("follow")], [String(last), epoch, null], s.url.href);
  }
  // What the page shows after it is what kilnd holds after it, each once.
  const resp = await fetch(`${kilnd.url}/events?after=${last}&follow=false`, { headers: { Authorization: "Bearer " + kilnd.token } });
  const kept = (await resp.text()).split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const shown = await tab.$$eval("#events-list li", (lis) => lis.map((li) => ({ seq: Number(li.dataset.seq), type: li.dataset.type, sandbox: li.dataset.sandbox })));
  assert.deepEqual(shown.filter((e) => e.seq > last).reverse(), kept.map((e) => ({ seq: e.seq, type: e.type, sandbox: e.sandbox })));
  assert.ok(kept.some((e) => e.type === "sandbox.created" && e.sandbox === b));
  assert.deepEqual(shown.map((e) => e.seq), [...new Set(shown.map((e) => e.seq))].sort((x, y) => y - x), "an event shown twice, or out of order");
  assert.deepEqual(said, []);
  await tab.close();
  await api("DELETE", `/sandboxes/${b}`);
});

/**
 * A docker save tar of busybox alone (the host's static one, with sh, ls,
 * stty, cat and echo as its links): an image without bash.
 */
function busyboxImage(name) {
  const dir = mkdtempSync(join(tmpdir(), "console-busybox-"));
  try {
    const root = join(dir, "root");
    mkdirSync(join(root, "bin"), { recursive: true });
    mkdirSync(join(root, "tmp"));
    copyFileSync("/bin/busybox", join(root, "bin", "busybox"));
    chmodSync(join(root, "bin", "busybox"), 0o755);
    for (const applet of ["sh", "ls", "stty", "cat", "echo"]) symlinkSync("busybox", join(root, "bin", applet));
    const out = join(dir, "image");
    mkdirSync(out);
    execFileSync("tar", ["--owner=0", "--group=0", "--numeric-owner", "-C", root, "-cf", join(out, "layer.tar"), "."]);
    const sha256 = (b) => createHash("sha256").update(b).digest("hex");
    const arch = { x64: "amd64", arm64: "arm64" }[process.arch] ?? process.arch;
    const config = JSON.stringify({ architecture: arch, os: "linux", config: { Env: ["PATH=/bin"], Cmd: ["sh"] },
      rootfs: { type: "layers", diff_ids: ["sha256:" + sha256(readFileSync(join(out, "layer.tar")))] } });
    const configName = sha256(config) + ".json";
    writeFileSync(join(out, configName), config);
    writeFileSync(join(out, "manifest.json"), JSON.stringify([{ Config: configName, RepoTags: [name], Layers: ["layer.tar"] }]));
    execFileSync("tar", ["-C", out, "-cf", join(dir, "image.tar"), "manifest.json", configName, "layer.tar"]);
    return readFileSync(join(dir, "image.tar"));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("terminal: bash where the sandbox has it, sh where it has not", { skip: !existsSync("/bin/busybox") && "needs /bin/busybox (Debian's busybox-static)" }, async () => {
  /** Opens a terminal of no command in sb: what $BASH_VERSION is there, and the command the process list names. */
  const shell = async (sb) => {
    await openSandbox(sb);
    await page.fill("#start input[name=command]", "");
    await page.check("#start-terminal");
    const was = await openProcessId();
    await page.click("#start button[type=submit]");
    await page.waitForFunction((was) => {
      const p = new URLSearchParams(location.hash.slice(1)).get("process");
      return p && p !== was;
    }, was);
    const id = await openProcessId();
    await page.waitForSelector("#terminal .xterm-rows");
    await page.click("#terminal");
    await page.keyboard.type('echo "bash=${BASH_VERSION:-none}"\n');
    const said = await page.waitForFunction(() => [...document.querySelectorAll("#terminal .xterm-rows > div")]
      .map((r) => r.textContent.trim()).find((t) => /^bash=\S+$/.test(t)), null, { timeout: 15_000 });
    const bash = (await said.jsonValue()).slice("bash=".length);
    await page.waitForSelector(`#processes tr[data-process="${id}"]`);
    const command = await page.textContent(`#processes tr[data-process="${id}"] td.command`);
    await page.keyboard.type("exit\n");
    await page.waitForSelector(`#processes tr[data-process="${id}"][data-state="exited"]`, { timeout: 15_000 });
    assert.equal(await page.textContent(`#processes tr[data-process="${id}"] td.exit`), "0");
    await page.uncheck("#start-terminal");
    return { bash, command };
  };

  // A sandbox of the host's /usr has bash.
  const plain = (await api("POST", "/sandboxes", {})).id;
  const got = await shell(plain);
  assert.match(got.bash, /^\d+\.\d+/, JSON.stringify(got));
  assert.equal(got.command, "/bin/bash -l");
  await shot("16-terminal-bash");
  await api("DELETE", `/sandboxes/${plain}`);

  // busybox has none: sh. The files API answers the page's question
  // about /bin/bash with 404, which the browser reports: that, and
  // nothing else, is expected.
  const name = "example.test/console-busybox:1";
  const imported = await fetch(kilnd.url + "/images/import", { method: "POST", headers: { Authorization: "Bearer " + kilnd.token, "Content-Type": "application/x-tar" }, body: busyboxImage(name) });
  assert.ok(imported.ok, `${imported.status} ${await imported.clone().text()}`);
  assert.match(await imported.text(), /"done"/);
  const small = (await api("POST", "/sandboxes", { image: name })).id;
  const before = problems.length;
  const bare = await shell(small);
  assert.deepEqual(bare, { bash: "none", command: "sh -l" });
  const asked = problems.splice(before);
  assert.ok(asked.length > 0 && asked.every((p) => /\/files\/bin\/bash\?stat=true$|status of 404/.test(p)), asked.join("\n"));
  await shot("17-terminal-sh");
  await api("DELETE", `/sandboxes/${small}`);
  await api("DELETE", `/images/${name}`);
});

/**
 * A preview's page that tries to take over kilnd, run in the browser: it
 * reads the console's token from its own storage and from the console's
 * page (framed and opened), calls the API (with credentials and without,
 * by fetch, a form-like request and a WebSocket, and on its own host),
 * reads another preview's storage and cookies (framed, opened, fetched),
 * and sets cookies for every name under localhost. Each outcome is "read:
 * VALUE" or "refused: ERROR"; window.results has them all.
 */
async function hostile() {
  const p = JSON.parse(decodeURIComponent(location.hash.slice(1)));
  const results = {};
  const read = async (what, f) => {
    try {
      results[what] = "read: " + JSON.stringify(await f());
    } catch (err) {
      results[what] = "refused: " + (err?.name ?? String(err));
    }
  };
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const frame = (src) => new Promise((resolve) => {
    const f = document.createElement("iframe");
    f.onload = () => resolve(f);
    setTimeout(() => resolve(f), 5000);
    f.src = src;
    document.body.append(f);
  });
  // An opened window holds its opener's about:blank until its page
  // arrives: wait, bounded, until it is closed to the opener or another
  // origin's.
  const opened = async (url) => {
    const w = window.open(url);
    for (let i = 0; i < 300 && w && !w.closed; i++) {
      try {
        if (w.location.href !== "about:blank") break;
      } catch {
        break;
      }
      await sleep(50);
    }
    return w;
  };
  const exec = JSON.stringify({ command: "touch", args: ["/workspace/pwned"] });

  await read("own sessionStorage", () => sessionStorage.getItem("kiln.token"));
  await read("own localStorage", () => localStorage.getItem("kiln.token"));
  await read("own cookies", () => document.cookie);

  const cf = await frame(p.console);
  await read("framed console's sessionStorage", () => cf.contentWindow.sessionStorage.getItem("kiln.token"));
  await read("framed console's localStorage", () => cf.contentWindow.localStorage.length);
  await read("framed console's page", () => cf.contentWindow.document.body.innerHTML);
  const cw = await opened(p.console);
  await read("opened console's sessionStorage", () => cw.sessionStorage.getItem("kiln.token"));
  await read("opened console's page", () => cw.document.body.innerHTML);
  cw?.close();

  for (const credentials of ["include", "omit"]) {
    await read(`API list, credentials ${credentials}`, async () => {
      const r = await fetch(p.api + "/sandboxes", { credentials });
      return [r.status, await r.text()];
    });
    await read(`API exec, credentials ${credentials}`, async () => {
      const r = await fetch(`${p.api}/sandboxes/${p.sandbox}/exec`, { method: "POST", credentials, headers: { "Content-Type": "application/json" }, body: exec });
      return [r.status, await r.text()];
    });
    await read(`API exec as a form would, credentials ${credentials}`, async () => {
      const r = await fetch(`${p.api}/sandboxes/${p.sandbox}/exec`, { method: "POST", mode: "no-cors", credentials, body: exec });
      return [r.type, r.status];
    });
  }
  await read("API create as a form would", async () => {
    const r = await fetch(p.api + "/sandboxes", { method: "POST", mode: "no-cors", credentials: "include", body: "{}" });
    return [r.type, r.status];
  });
  await read("API WebSocket", () => new Promise((resolve) => {
    const ws = new WebSocket(`${p.api.replace(/^http/, "ws")}/sandboxes/${p.sandbox}/exec-stream`);
    ws.onopen = () => resolve("open");
    ws.onclose = (ev) => resolve(`closed ${ev.code}`);
  }));
  await read("API on its own host", async () => {
    const r = await fetch(location.origin + "/sandboxes", { credentials: "include" });
    return [r.status, (await r.json()).error.code];
  });
  await read("console on its own host", async () => (await fetch(location.origin + "/")).status);

  const vf = await frame(p.victim);
  await read("framed preview's localStorage", () => vf.contentWindow.localStorage.getItem("secret"));
  await read("framed preview's cookies", () => vf.contentWindow.document.cookie);
  const vw = await opened(p.victim);
  await read("opened preview's sessionStorage", () => vw.sessionStorage.getItem("secret"));
  await read("opened preview's localStorage", () => vw.localStorage.getItem("secret"));
  await read("opened preview's cookies", () => vw.document.cookie);
  vw?.close();
  await read("preview fetched with credentials", async () => (await fetch(p.victim, { credentials: "include" })).text());

  document.cookie = "tossed=1; Domain=localhost; Path=/";
  document.cookie = "own=1; Path=/";
  await read("own cookies, set for localhost and for itself", () => document.cookie);
  window.results = results;
}

/** The page of the preview that is attacked: a secret in each of its stores. */
const victimPage = `<!doctype html><title>victim</title><script>
localStorage.setItem("secret", "victim-local");
sessionStorage.setItem("secret", "victim-session");
document.cookie = "vsecret=victim-cookie; Path=/";
document.title = "victim ready";
</script>`;

test("a hostile preview page: the console's storage, the API and another preview's storage and cookies are out of its reach", async () => {
  // The console logged in, no sandbox open.
  await page.goto(kilnd.url + "/");
  await page.waitForSelector("text=Log out");
  // Each preview a sandbox's web server; the victim in another sandbox.
  const serve = async (file, html) => {
    const sb = (await api("POST", "/sandboxes", {})).id;
    const put = await fetch(`${kilnd.url}/sandboxes/${sb}/files/workspace/${file}`, { method: "PUT", headers: { Authorization: "Bearer " + kilnd.token }, body: html });
    assert.ok(put.ok, String(put.status));
    await api("POST", `/sandboxes/${sb}/exec-stream`, { command: "python3", args: ["-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/workspace"] });
    for (const deadline = Date.now() + 15_000; ;) {
      const r = await fetch(`${kilnd.url}/sandboxes/${sb}/ports/8000/${file}`, { headers: { Authorization: "Bearer " + kilnd.token } });
      if (r.status === 200) break;
      assert.ok(Date.now() < deadline, `the server in ${sb}: ${r.status}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    return { sb, preview: await api("POST", `/sandboxes/${sb}/previews`, { port: 8000 }) };
  };
  const victim = await serve("victim.html", victimPage);
  const attacker = await serve("hostile.html", `<!doctype html><title>hostile</title><body><script>(${hostile})()</script>`);
  const port = new URL(kilnd.url).port;
  for (const p of [victim.preview, attacker.preview]) {
    assert.equal(new URL(p.url).host, `${p.id}.localhost:${port}`);
  }
  const sandboxes = (await api("GET", "/sandboxes")).length;

  // The previews' pages in the console's browser, beside it.
  const ctx = page.context();
  const victimTab = await ctx.newPage();
  await victimTab.goto(victim.preview.url + "victim.html");
  await victimTab.waitForFunction(() => document.title === "victim ready");
  const victimStores = () => victimTab.evaluate(() => ({ local: localStorage.getItem("secret"), session: sessionStorage.getItem("secret"), cookie: document.cookie }));
  assert.deepEqual(await victimStores(), { local: "victim-local", session: "victim-session", cookie: "vsecret=victim-cookie" });

  const hostileTab = await ctx.newPage();
  const params = { api: kilnd.url, console: kilnd.url + "/", victim: victim.preview.url + "victim.html", sandbox: victim.sb };
  await hostileTab.goto(attacker.preview.url + "hostile.html#" + encodeURIComponent(JSON.stringify(params)));
  await hostileTab.waitForFunction(() => window.results !== undefined, null, { timeout: 60_000 });
  const results = await hostileTab.evaluate(() => window.results);
  await hostileTab.screenshot({ path: artifacts + "13-hostile-preview.png" });
  const said = JSON.stringify(results, null, 1);
  writeFileSync(artifacts + "13-hostile-preview.json", said + "\n");
  for (const secret of [kilnd.token, "victim-local", "victim-session", "victim-cookie"]) {
    assert.ok(!said.includes(secret), `the hostile page read ${secret}:\n${said}`);
  }
  assert.deepEqual(results, {
    "own sessionStorage": "read: null",
    "own localStorage": "read: null",
    "own cookies": 'read: ""',
    // Another origin's, and the console's page is framed by nobody and
    // opens apart from its opener (Cross-Origin-Opener-Policy).
    "framed console's sessionStorage": "refused: SecurityError",
    "framed console's localStorage": "refused: SecurityError",
    "framed console's page": "refused: SecurityError",
    "opened console's sessionStorage": "refused: SecurityError",
    "opened console's page": "refused: SecurityError",
    // The API: refused for the page's origin; its answer unreadable.
    "API list, credentials include": "refused: TypeError",
    "API list, credentials omit": "refused: TypeError",
    "API exec, credentials include": "refused: TypeError",
    "API exec, credentials omit": "refused: TypeError",
    "API exec as a form would, credentials include": 'read: ["opaque",0]',
    "API exec as a form would, credentials omit": 'read: ["opaque",0]',
    "API create as a form would": 'read: ["opaque",0]',
    "API WebSocket": 'read: "closed 1006"',
    // Its own host serves its preview alone.
    "API on its own host": 'read: [404,"not_found"]',
    "console on its own host": "read: 404",
    // Another preview: another origin, another site.
    "framed preview's localStorage": "refused: SecurityError",
    "framed preview's cookies": "refused: SecurityError",
    "opened preview's sessionStorage": "refused: SecurityError",
    "opened preview's localStorage": "refused: SecurityError",
    "opened preview's cookies": "refused: SecurityError",
    "preview fetched with credentials": "refused: TypeError",
    // A cookie for every name under localhost is refused; its own host's is kept.
    "own cookies, set for localhost and for itself": 'read: "own=1"',
  }, said);

  // Nothing it tried did anything: no command ran, no sandbox was made.
  const pwned = await fetch(`${kilnd.url}/sandboxes/${victim.sb}/files/workspace/pwned`, { headers: { Authorization: "Bearer " + kilnd.token } });
  assert.equal(pwned.status, 404);
  assert.equal((await api("GET", "/sandboxes")).length, sandboxes);
  // The victim's stores are as it left them; the browser holds each
  // preview's cookie for its own host alone, and none for kilnd's.
  assert.deepEqual(await victimStores(), { local: "victim-local", session: "victim-session", cookie: "vsecret=victim-cookie" });
  const jar = (await ctx.cookies()).map((c) => `${c.name}@${c.domain}`).sort();
  assert.deepEqual(jar, [`own@${attacker.preview.id}.localhost`, `vsecret@${victim.preview.id}.localhost`].sort());
  assert.deepEqual(await ctx.cookies(kilnd.url), []);
  await hostileTab.close();
  await victimTab.close();

  // The console still has its token, and works: it runs a command in the
  // sandbox the page attacked.
  assert.equal(await page.evaluate(() => sessionStorage.getItem("kiln.token")), kilnd.token);
  await openSandbox(victim.sb);
  await page.fill("#start input[name=command]", "echo still-here");
  await page.click("#start button[type=submit]");
  await page.waitForSelector("#log .exit", { timeout: 30_000 });
  assert.equal(await page.textContent("#log"), "still-here\n[process exited with code 0]\n");
  await shot("14-after-the-hostile-preview");
  // And logs in again.
  await page.click("text=Log out");
  await page.waitForSelector("#login");
  assert.equal(await page.evaluate(() => sessionStorage.getItem("kiln.token")), null);
  await page.fill("#token", kilnd.token);
  await page.click("#login button[type=submit]");
  await page.waitForSelector("text=Log out");
  await page.goto(kilnd.url + "/");
  await page.waitForSelector("text=Log out");
  await api("DELETE", `/sandboxes/${victim.sb}`);
  await api("DELETE", `/sandboxes/${attacker.sb}`);
});

test("the token went into no URL the console asked for; nothing the page reported", async () => {
  assert.ok(urls.length > 10, `${urls.length} URLs`);
  assert.deepEqual(urls.filter((u) => u.includes(kilnd.token)), []);
  assert.ok(urls.some((u) => u.startsWith("ws://")), "no WebSocket seen");
  assert.equal(await page.evaluate(() => sessionStorage.getItem("kiln.token")), kilnd.token);
  assert.deepEqual(problems, [], "the page reported problems");
});
