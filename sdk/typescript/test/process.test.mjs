// The SDK against a real kilnd: the streaming seed's contract, and where
// kiln.v1 does better than it (resuming from offsets, exact gaps).

import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import net from "node:net";

import { Client, SandkilnError, LIMITS, readProcessLines } from "../dist/index.js";
import { sandboxSuite } from "./suite.mjs";

let kilnd, client, sandbox;
sandboxSuite((s) => ({ kilnd, client, sandbox } = s));

const sh = (script) => ({ kind: "argv", argv: ["sh", "-c", script] });

async function collect(child, options) {
  const out = { stdout: "", stderr: "", terminal: "" };
  let lost = 0;
  for await (const c of child.output(options)) {
    if (c.lost) lost += c.lost;
    else out[c.stream] += c.text ?? new TextDecoder().decode(c.bytes);
  }
  return { ...out, lost };
}

async function rejects(p, code) {
  await assert.rejects(p, (err) => {
    assert.ok(err instanceof SandkilnError, `not a SandkilnError: ${err}`);
    assert.equal(err.code, code, err.message);
    return true;
  });
}

test("the seed's for i in 1 2 3: lines, then the exit", async () => {
  const child = await sandbox.processes.start({
    command: sh("for i in 1 2 3; do echo line-$i; done; echo oops >&2; exit 3"),
    output: { mode: "stream" },
  });
  const out = await collect(child);
  assert.equal(out.stdout, "line-1\nline-2\nline-3\n");
  assert.equal(out.stderr, "oops\n");
  const r = await child.wait();
  assert.equal(r.exitCode, 3);
  assert.equal(r.signal, null);
  assert.equal(r.outputComplete, true);
  assert.deepEqual(r.streams.stdout, { bytes: 21, lostBytes: 0, ended: true });
  const st = await child.status();
  assert.equal(st.state, "exited");
  assert.equal(st.exit.exitCode, 3);
  assert.ok(st.observedAt instanceof Date);
  await child.detach();
  await child.detach(); // again is safe
});

test("input in order, strings and bytes, then EOF", async () => {
  const child = await sandbox.processes.start({ command: { kind: "argv", argv: ["cat"] }, stdin: "pipe", output: { mode: "stream" } });
  const output = collect(child);
  await child.write("first request\n");
  await child.write(new TextEncoder().encode("second request\n"));
  await child.write(""); // checks input is allowed; no close
  const writes = [];
  for (let i = 0; i < 50; i++) writes.push(child.write(`w${i}\n`)); // not awaited one by one: still in order
  await Promise.all(writes);
  await child.closeStdin();
  await child.closeStdin(); // once
  await rejects(child.write("late\n"), "STDIN_CLOSED");
  const [out, r] = await Promise.all([output, child.wait()]);
  let want = "first request\nsecond request\n";
  for (let i = 0; i < 50; i++) want += `w${i}\n`;
  assert.equal(out.stdout, want);
  assert.equal(r.exitCode, 0);
  await child.detach();
});

test("input bounds: 64 KiB a write, 256 KiB and 256 calls queued", async () => {
  const child = await sandbox.processes.start({ command: { kind: "argv", argv: ["sh", "-c", "cat >/dev/null; sleep 30"] }, stdin: "pipe", output: { mode: "stream" } });
  await rejects(child.write(new Uint8Array(LIMITS.maxWriteBytes + 1)), "INVALID_ARGUMENT");
  // Queued at once: the 257th call is refused locally, the others go.
  const calls = [];
  for (let i = 0; i < LIMITS.maxInputCalls; i++) calls.push(child.write("x"));
  await rejects(child.write("x"), "INPUT_CAPACITY");
  await Promise.all(calls);
  const big = [];
  for (let i = 0; i < 4; i++) big.push(child.write(new Uint8Array(LIMITS.maxWriteBytes)));
  await rejects(child.write("y"), "INPUT_CAPACITY"); // 256 KiB queued: full
  await Promise.all(big);
  // Room again once the process has read what kilnd held for it: kilnd's
  // own queue is 256 KiB too, and cat takes a moment on a busy host.
  for (let i = 0; ; i++) {
    const st = await sandbox.transport.call("GET", sandbox.path(`/exec-stream/${child.id}`));
    if (st.stdin.delivered === st.stdin.accepted) break;
    assert.ok(i < 10000, `stdin never delivered: ${JSON.stringify(st.stdin)}`);
  }
  await child.write("z");
  const st = await sandbox.transport.call("GET", sandbox.path(`/exec-stream/${child.id}`));
  assert.equal(st.stdin.accepted, LIMITS.maxInputCalls + 4 * LIMITS.maxWriteBytes + 1);
  await child.terminate();
  await child.wait();
  await child.detach();
  const none = await sandbox.processes.start({ command: { kind: "argv", argv: ["true"] } });
  await rejects(none.write("x"), "STDIN_CLOSED");
  await none.detach();
});

test("all 256 byte values on stdout, invalid UTF-8 and NUL on stderr, exactly", async () => {
  const all = new Uint8Array(256 * 1024);
  for (let i = 0; i < all.length; i++) all[i] = i % 256;
  const child = await sandbox.processes.start({
    command: sh("cat; printf 'a\\000b\\377\\376c\\300' >&2"), stdin: "pipe", output: { mode: "stream", format: "bytes" },
  });
  const parts = { stdout: [], stderr: [] };
  const reading = (async () => {
    for await (const c of child.output()) {
      assert.ok(c.bytes.length <= LIMITS.maxChunkBytes, `a chunk of ${c.bytes.length} bytes`);
      parts[c.stream].push(c.bytes);
    }
  })();
  for (let i = 0; i < all.length; i += LIMITS.maxWriteBytes) await child.write(all.subarray(i, i + LIMITS.maxWriteBytes));
  await child.closeStdin();
  await reading;
  assert.deepEqual(Buffer.concat(parts.stdout), Buffer.from(all));
  assert.deepEqual(Buffer.concat(parts.stderr), Buffer.from([0x61, 0, 0x62, 0xff, 0xfe, 0x63, 0xc0]));
  assert.equal((await child.wait()).outputComplete, true);
  await child.detach();
});

test("text: characters split across frames decode whole, invalid bytes become U+FFFD", async () => {
  // é (2 bytes), € (3), 😀 (4), each written byte by byte with a pause, then a cut character at the end.
  const child = await sandbox.processes.start({
    command: sh("for b in '\\303' '\\251' '\\342' '\\202' '\\254' '\\360' '\\237' '\\230' '\\200'; do printf \"$b\"; sleep 0.05; done; printf 'x\\377y\\342\\202'"),
    output: { mode: "stream" },
  });
  const out = await collect(child);
  assert.equal(out.stdout, "é€😀x\uFFFDy\uFFFD");
  await child.detach();
});

test("wait with an abort signal: WAIT_ABORTED, the process untouched", async () => {
  const child = await sandbox.processes.start({ command: sh("sleep 30"), output: { mode: "stream" } });
  const ac = new AbortController();
  const waiting = child.wait({ signal: ac.signal });
  ac.abort();
  await rejects(waiting, "WAIT_ABORTED");
  assert.equal((await child.status()).state, "running");
  // Concurrent terminates share one request.
  const [a, b] = await Promise.all([child.terminate(), child.terminate()]);
  assert.deepEqual(a, { status: "requested" });
  assert.deepEqual(b, a);
  const r = await child.wait();
  assert.equal(r.signal, "SIGKILL");
  assert.equal(r.exitCode, 137); // 128 + 9, the shell's and Docker's convention
  assert.deepEqual(await child.terminate(), { status: "exited" });
  await child.detach();
  await rejects(child.status(), "DETACHED");
});

test("start refuses what it cannot honour, before starting", async () => {
  await rejects(sandbox.processes.start({ command: sh("true"), deadlineSeconds: 5 }), "INVALID_ARGUMENT");
  await rejects(sandbox.processes.start({ command: sh("true"), output: { mode: "stream", maxOutputBytes: 10 } }), "INVALID_ARGUMENT");
  await rejects(sandbox.processes.start({ command: sh("true"), output: { maxOutputBytes: LIMITS.maxFiniteOutput + 1 } }), "INVALID_ARGUMENT");
  await rejects(sandbox.processes.start({ command: { kind: "argv", argv: [] } }), "INVALID_ARGUMENT");
  const ac = new AbortController();
  ac.abort();
  await rejects(sandbox.processes.start({ command: sh("true"), signal: ac.signal }), "WAIT_ABORTED");
  await rejects(sandbox.processes.start({ command: { kind: "argv", argv: ["/no/such/program"] } }), "INVALID_ARGUMENT");
});

test("finite mode: at most maxOutputBytes, then OUTPUT_CAPACITY; leaving the loop detaches", async () => {
  const child = await sandbox.processes.start({ command: sh("head -c 5000 /dev/zero"), output: { format: "bytes", maxOutputBytes: 4096 } });
  let got = 0;
  await rejects((async () => {
    for await (const c of child.output()) got += c.bytes.length;
  })(), "OUTPUT_CAPACITY");
  assert.equal(got, 4096);
  await rejects(child.wait(), "DETACHED");

  const small = await sandbox.processes.start({ command: sh("echo one; echo two") });
  for await (const c of small.output()) {
    assert.equal(c.text.startsWith("one"), true);
    break;
  }
  await rejects(small.status(), "DETACHED");
});

test("a slow consumer: by default the output pauses and resumes, nothing lost", async () => {
  const total = 200 * 1024; // od makes it 640 KiB: within the ring, nothing can be evicted
  const child = await sandbox.processes.start({ command: sh(`head -c ${total} /dev/urandom | od -An -v -tx1`), output: { mode: "stream" } });
  let text = "";
  for await (const c of child.output()) {
    assert.equal(c.lost, 0);
    text += c.text;
    await new Promise((r) => setTimeout(r, 1)); // slower than the output
  }
  assert.equal(text.replace(/\s+/g, "").length, 2 * total);
  assert.equal((await child.wait()).outputComplete, true);
  await child.detach();
});

test("a slow consumer loses nothing: the process waits for it, and kilnd sends no more than the queue holds", async () => {
  const total = 4 << 20; // four times kilnd's ring
  const child = await sandbox.processes.start({ command: sh(`head -c ${total} /dev/zero`), output: { mode: "stream", format: "bytes" } });
  let got = 0;
  let slow = 0;
  for await (const c of child.output()) {
    if (c.stream !== "stdout") continue;
    assert.equal(c.offset, got, "a chunk repeated or skipped");
    assert.equal(c.lost, 0);
    got += c.bytes.length;
    if (slow++ < 64) await new Promise((r) => setTimeout(r, 2));
  }
  assert.equal(got, total);
  const r = await child.wait();
  assert.equal(r.outputComplete, true);
  assert.equal(r.exitCode, 0);
  await child.detach();
});

test("one consumer at a time", async () => {
  const child = await sandbox.processes.start({ command: sh("sleep 2; echo done"), output: { mode: "stream" } });
  const first = collect(child);
  await new Promise((r) => setTimeout(r, 50));
  await rejects(collect(child), "OUTPUT_IN_USE");
  assert.equal((await first).stdout, "done\n");
  await child.detach();
});

test("disconnect, reference, reopen: the output resumes where it stood, nothing repeated, complete", async () => {
  const child = await sandbox.processes.start({
    command: sh("echo one; read x; echo two; echo err >&2"), stdin: "pipe", output: { mode: "stream" },
  });
  const ref = child.reference(); // before disconnect, as the seed does it: it follows the handle
  let first = "";
  for await (const c of child.output()) {
    first += c.text;
    if (first === "one\n") break;
  }
  await child.disconnect();
  const saved = JSON.parse(JSON.stringify({ sandbox: sandbox.reference, process: ref }));
  assert.equal(saved.process.offsets.stdout, 4);
  await rejects(child.write("x\n"), "DETACHED");

  const other = new Client({ url: kilnd.url, token: kilnd.token });
  const again = await other.sandboxes.get(saved.sandbox);
  const reopened = await again.processes.reopen(saved.process);
  await reopened.write("go\n");
  const rest = await collect(reopened);
  assert.equal(rest.stdout, "two\n");
  assert.equal(rest.stderr, "err\n");
  assert.equal(reopened.outputGap, false);
  const r = await reopened.wait();
  assert.equal(r.outputComplete, true);
  await reopened.detach();
  await other.close();

  await rejects(sandbox.processes.reopen({ ...saved.process, sandbox: "other" }), "INVALID_ARGUMENT");
  await rejects(sandbox.processes.reopen({ ...saved.process, expiresAt: new Date(Date.now() - 1).toISOString() }), "FAILED_PRECONDITION");
  await rejects(sandbox.processes.reopen({ ...saved.process, process: "01a22779-5cfd-7451-9354-2e19949d5c7f" }), "NOT_FOUND");
});

test("reopen after eviction: a gap of exactly the evicted bytes, outputComplete false", async () => {
  const total = 3 << 20; // three times the ring
  // A process that does not wait for its reader, and a handle that goes
  // on past gaps, saying how much they lost.
  const child = await sandbox.processes.start({ command: sh(`head -c ${total} /dev/zero`), output: { mode: "stream", format: "bytes", flow: "drop", overflow: "report" } });
  const ref = child.reference();
  await child.disconnect();
  const q = await sandbox.processes.reopen(ref);
  await q.wait();
  let got = 0;
  let lost = 0;
  for await (const c of q.output()) {
    if (c.lost) lost += c.lost;
    got += c.bytes.length;
  }
  assert.ok(lost > 0);
  assert.equal(got + lost, total);
  assert.equal(q.outputGap, true);
  assert.equal(q.lostBytes, lost);
  assert.equal((await q.wait()).outputComplete, false);
  await q.detach();
});

test("a connection dropped mid-output: output() again resumes without loss or repeat", async () => {
  // A proxy that cuts every connection after 64 KiB from kilnd: less than
  // one full-size frame (a reader that is behind gets frames of up to
  // 256 KiB), but a connection's frames start at 16 KiB and grow, so each
  // connection brings whole frames, and each resume gets further.
  const upstream = new URL(kilnd.url);
  const proxy = net.createServer((c) => {
    const u = net.connect(Number(upstream.port), upstream.hostname);
    let n = 0;
    u.on("data", (d) => {
      n += d.length;
      c.write(d);
      if (n > 64 * 1024) {
        c.destroy();
        u.destroy();
      }
    });
    c.on("data", (d) => u.write(d));
    c.on("end", () => u.end());
    u.on("end", () => c.end());
    c.on("error", () => u.destroy());
    u.on("error", () => c.destroy());
  });
  await new Promise((r) => proxy.listen(0, "127.0.0.1", r));
  try {
    const cut = new Client({ url: `http://127.0.0.1:${proxy.address().port}`, token: kilnd.token });
    const lines = 250000;
    const child = await sandbox.processes.start({ command: sh(`i=0; while [ $i -lt ${lines} ]; do i=$((i+1)); echo $i; done`), output: { mode: "stream" } });
    const via = await (await cut.sandboxes.get(sandbox.id)).processes.reopen(child.reference());
    await child.detach();
    let text = "";
    let breaks = 0;
    for (;;) {
      try {
        for await (const c of via.output()) text += c.text;
        break;
      } catch (err) {
        assert.equal(err.code, "UNAVAILABLE", err.message);
        breaks++;
        assert.ok(breaks < 100, `${breaks} breaks, ${text.length} bytes: ${err.message}\nkilnd:\n${kilnd.log().slice(-3000)}`);
      }
    }
    assert.ok(breaks >= 1, `${breaks} breaks`);
    let want = "";
    for (let i = 1; i <= lines; i++) want += i + "\n";
    assert.equal(text, want);
    assert.equal(via.outputGap, false);
    await via.detach();
    await cut.close();
  } finally {
    proxy.close();
  }
});

test("terminals: echo hi read back, resize, no closeStdin", async () => {
  const term = await sandbox.terminals.start({ command: { kind: "argv", argv: ["sh"] }, columns: 80, rows: 24 });
  assert.equal(typeof term.closeStdin, "undefined");
  let seen = "";
  const reading = (async () => {
    for await (const c of term.output()) {
      // The seed: "yields combined stdout/stderr as Uint8Array chunks".
      assert.ok(c instanceof Uint8Array);
      seen += new TextDecoder().decode(c);
    }
  })();
  await term.resize({ columns: 120, rows: 40 });
  await term.write("stty size; echo h''i\n");
  await term.write("exit 4\n");
  await reading;
  assert.match(seen, /40 120/);
  assert.match(seen, /\bhi\r?\n/);
  assert.equal((await term.wait()).exitCode, 4);
  await rejects(term.resize({ columns: 0, rows: 1 }), "INVALID_ARGUMENT");
  await term.detach();
});

test("exec: bounded, and with onOutput, the text live and the bytes kept", async () => {
  const plain = await sandbox.exec({ command: sh("echo out; echo err >&2; exit 2") });
  assert.deepEqual([plain.exitCode, plain.stdout, plain.stderr, plain.truncated], [2, "out\n", "err\n", false]);
  const seen = [];
  const live = await sandbox.exec(
    { command: { kind: "argv", argv: ["sh", "-c", "cat; echo done >&2"] }, stdin: "hello\n", maxOutputBytes: 4 },
    { onOutput: async (c) => seen.push(`${c.stream}:${c.text}`) },
  );
  assert.deepEqual(seen.sort(), ["stderr:done\n", "stdout:hello\n"]);
  assert.equal(live.exitCode, 0);
  assert.equal(live.truncated, true);
  assert.equal(live.stdoutBytes, 6);
  // The 4 bytes kept are the first that came: stdout's, or stderr's line
  // (read from another pipe, it may be taken before stdout's).
  assert.ok(
    (live.stdout === "hell" && live.stderr === "") || (live.stdout === "" && live.stderr === "done"),
    JSON.stringify([live.stdout, live.stderr]),
  );
  await rejects(sandbox.exec({ command: sh("true"), deadlineSeconds: 1 }, { onOutput: () => {} }), "INVALID_ARGUMENT");
  await assert.rejects(
    sandbox.exec({ command: sh("echo x; exit 5") }, { onOutput: () => { throw new Error("boom"); } }),
    (err) => err.code === "INTERNAL" && err.cause.message === "boom",
  );
});

test("readProcessLines over a real process", async () => {
  const child = await sandbox.processes.start({ command: sh("printf 'a\\r\\nb\\n'; echo e >&2; printf 'tail'"), output: { mode: "stream" } });
  const lines = [];
  for await (const l of readProcessLines(child.output(), { maxLineBytes: 100 })) lines.push(l);
  assert.deepEqual(lines.filter((l) => l.stream === "stdout").map((l) => [l.text, l.partial]), [["a", false], ["b", false], ["tail", true]]);
  assert.deepEqual(lines.filter((l) => l.stream === "stderr").map((l) => l.text), ["e"]);
  await child.detach();
});

test("errors carry kilnd's code", async () => {
  await rejects(client.sandboxes.get("nope"), "NOT_FOUND");
  const wrong = new Client({ url: kilnd.url, token: "wrong" });
  await rejects(wrong.sandboxes.list(), "UNAUTHENTICATED");
  const closed = net.createServer();
  await new Promise((r) => closed.listen(0, "127.0.0.1", r));
  const port = closed.address().port;
  await new Promise((r) => closed.close(r));
  const down = new Client({ url: `http://127.0.0.1:${port}`, token: "x" });
  await rejects(down.sandboxes.list(), "UNAVAILABLE");
  await rejects(down.sandboxes.create(), "UNAVAILABLE"); // refused: never sent, so not unknown
});

test("labels, and the list chosen by them, by state and with the deleted ones", async () => {
  const b = await client.sandboxes.create({ labels: { suite: "ts-labels" } });
  const a = await client.sandboxes.create({ labels: { suite: "ts-labels", tier: "front" } });
  try {
    assert.deepEqual(a.info.labels, { suite: "ts-labels", tier: "front" });
    const ids = async (o) => (await client.sandboxes.list(o)).map((s) => s.id);
    const both = [b.id, a.id]; // oldest first
    assert.deepEqual(await ids({ label: "suite=ts-labels" }), both);
    assert.deepEqual(await ids({ label: { suite: "ts-labels", tier: "front" } }), [a.id]);
    assert.deepEqual(await ids({ label: ["suite=ts-labels", "tier"] }), [a.id]);
    assert.deepEqual(await ids({ label: "suite=ts-labels", state: "stopped" }), []);
    await b.destroy();
    assert.deepEqual(await ids({ label: "suite=ts-labels" }), [a.id]);
    assert.deepEqual(await ids({ label: "suite=ts-labels", all: true }), both);
    await rejects(client.sandboxes.list({ state: "frozen" }), "INVALID_ARGUMENT");
    await rejects(client.sandboxes.list({ colour: "red" }), "INVALID_ARGUMENT");
  } finally {
    await a.destroy();
  }
});

test("events: each sandbox's creation and deletion, in order, taken up again after the last read", async () => {
  let last = 0;
  for await (const e of client.events({ follow: false })) last = e.seq;
  const sb = await client.sandboxes.create({ labels: { for: "ts-events" } });
  await sb.destroy();
  // Another sandbox's event may come between (a process's end, told late).
  const got = [];
  for await (const e of client.events({ after: last, follow: false })) if (e.sandbox === sb.id) got.push(e);
  assert.deepEqual(got.map((e) => [e.type, e.sandbox]), [["sandbox.created", sb.id], ["sandbox.deleted", sb.id]]);
  assert.ok(last < got[0].seq && got[0].seq < got[1].seq, JSON.stringify([last, got]));
  // Outside a cluster no event has a node: a node's events are none.
  const ofNode = [];
  for await (const e of client.events({ node: "n1", follow: false })) ofNode.push(e);
  assert.deepEqual(ofNode, []);
  // Following: the next event comes as it happens.
  const ac = new AbortController();
  const next = (async () => {
    for await (const e of client.events({ after: got[1].seq, signal: ac.signal })) if (e.type.startsWith("sandbox.")) return e;
  })();
  const other = await client.sandboxes.create();
  const e = await next;
  ac.abort();
  assert.equal(e.type, "sandbox.created");
  assert.equal(e.sandbox, other.id);
  await other.destroy();
  await rejects((async () => { for await (const _ of client.events({ type: "nothing" })) break; })(), "INVALID_ARGUMENT");
});

test("health and version: kilnd answers, and says which build it is", async () => {
  assert.equal(await client.health(), true);
  const v = await client.version();
  assert.equal(typeof v.version, "string");
  assert.ok(v.version.length > 0, JSON.stringify(v));
  assert.match(v.go_version, /^go1\./);
});

test("files and previews", async () => {
  await sandbox.files.write("/workspace/dir/a.txt", "hello");
  assert.equal(await sandbox.files.readText("/workspace/dir/a.txt"), "hello");
  const names = (await sandbox.files.list("/workspace/dir")).map((f) => f.name);
  assert.deepEqual(names, ["a.txt"]);
  const moved = await sandbox.files.move("/workspace/dir/a.txt", "/workspace/dir/b.txt");
  assert.equal(moved.name, "b.txt");
  assert.equal(await sandbox.files.readText("/workspace/dir/b.txt"), "hello");
  await rejects(sandbox.files.stat("/workspace/dir/a.txt"), "NOT_FOUND");
  await rejects(sandbox.files.move("/workspace/dir/b.txt", "relative"), "INVALID_ARGUMENT");
  await sandbox.files.remove("/workspace/dir", { recursive: true });
  await rejects(sandbox.files.stat("/workspace/dir"), "NOT_FOUND");
  const p = await sandbox.previews.create({ port: 8080, ttlSeconds: 60 });
  // A host of its own, under localhost, on kilnd's port.
  const u = new URL(p.url);
  assert.equal(u.host, `${p.id}.localhost:${new URL(kilnd.url).port}`);
  assert.equal(u.pathname, `/preview/${p.token}/`);
  // It reaches the sandbox's port (nobody listens there: kilnd says so)
  // on its own host, and nothing on kilnd's. Sent to kilnd's loopback
  // address with the preview's Host, as a browser resolves ID.localhost;
  // the runtime's resolver would ask DNS.
  const get = (host, path) => new Promise((resolve, reject) => {
    const req = http.get({ host: "127.0.0.1", port: new URL(kilnd.url).port, path, headers: { host } }, (resp) => {
      resp.resume();
      resp.on("end", () => resolve(resp.statusCode));
    });
    req.on("error", reject);
  });
  assert.equal(await get(u.host, u.pathname), 502);
  assert.equal(await get(new URL(kilnd.url).host, u.pathname), 404);
  await sandbox.previews.revoke(p.id);
  assert.equal(await get(u.host, u.pathname), 401);
});

test("processes.get: a handle on a process another client started, from its beginning", async () => {
  const started = await sandbox.processes.start({ command: sh("echo a; echo b >&2"), output: { mode: "stream" } });
  await started.wait();
  await started.detach();
  const other = new Client({ url: kilnd.url, token: kilnd.token });
  const again = await (await other.sandboxes.get(sandbox.id)).processes.get(started.id);
  const out = await collect(again);
  assert.deepEqual([out.stdout, out.stderr], ["a\n", "b\n"]);
  assert.equal((await again.wait()).outputComplete, true);
  await again.detach();
  const term = await sandbox.terminals.start({ command: sh("echo t") });
  const t = await sandbox.processes.get(term.id);
  assert.equal(typeof t.resize, "function");
  await t.wait();
  await t.detach();
  await term.detach();
  await rejects(sandbox.processes.get("01a22779-5cfd-7451-9354-2e19949d5c7f"), "NOT_FOUND");
});

test("names: create with one, get by it, the handle holding the full id; a name taken is ALREADY_EXISTS", async () => {
  const named = await client.sandboxes.create({ name: "sdk-named" });
  try {
    assert.equal(named.name, "sdk-named");
    assert.equal(named.info.hostname, "sdk-named");
    const got = await client.sandboxes.get("sdk-named");
    assert.equal(got.id, named.id);
    assert.equal(got.name, "sdk-named");
    await rejects(client.sandboxes.create({ name: "sdk-named" }), "ALREADY_EXISTS");
    await rejects(client.sandboxes.create({ name: "Not_A_Label" }), "INVALID_ARGUMENT");
    assert.equal(sandbox.name, undefined);
  } finally {
    await named.destroy();
  }
  await rejects(client.sandboxes.get("sdk-named"), "NOT_FOUND");
});

test("destroy lets go of every handle on the sandbox made through this client, whichever Sandbox made it", async () => {
  const made = await client.sandboxes.create();
  const child = await made.processes.start({ command: sh("sleep 30"), output: { mode: "stream" } });
  const again = await (await client.sandboxes.get(made.id)).processes.get(child.id);
  const mine = await sandbox.processes.start({ command: sh("sleep 30"), output: { mode: "stream" } });
  await (await client.sandboxes.get(made.id)).destroy(); // a third Sandbox of the same id
  await rejects(child.status(), "DETACHED");
  await rejects(child.terminate(), "DETACHED");
  await rejects(again.wait(), "DETACHED");
  await rejects(again.signal("SIGTERM"), "DETACHED");
  assert.equal((await mine.status()).state, "running", "another sandbox's handle was let go");
  await mine.terminate();
  await mine.wait();
  await mine.detach();
});

test("signal: SIGTERM ends a process that heeds it; one that ignores it runs on until terminate()", async () => {
  const heeds = await sandbox.processes.start({ command: sh("sleep 30"), output: { mode: "stream" } });
  await heeds.signal("SIGTERM");
  const r = await heeds.wait();
  assert.equal(r.signal, "SIGTERM");
  assert.equal(r.exitCode, 143); // 128 + 15
  await heeds.detach();

  const ignores = await sandbox.processes.start({ command: sh("trap '' TERM; echo ready; while :; do sleep 1; done"), output: { mode: "stream" } });
  for await (const c of ignores.output()) if (c.text.includes("ready")) break; // the trap is set
  await ignores.signal("SIGTERM");
  const ac = new AbortController();
  const waiting = ignores.wait({ signal: ac.signal });
  assert.equal((await ignores.status()).state, "running");
  assert.deepEqual(await ignores.terminate(), { status: "requested" });
  assert.equal((await waiting).signal, "SIGKILL");
  await rejects(ignores.signal("NOSUCH"), "INVALID_ARGUMENT");
  await ignores.detach();
});

test("terminals: status, signal and terminate; reopen from a reference, its output resumed", async () => {
  const term = await sandbox.terminals.start({ command: { kind: "argv", argv: ["sh"] }, columns: 4096, rows: 4096 });
  await rejects(sandbox.terminals.start({ command: { kind: "argv", argv: ["sh"] }, columns: 4097, rows: 24 }), "INVALID_ARGUMENT");
  await rejects(term.resize({ columns: 80, rows: 4097 }), "INVALID_ARGUMENT");
  assert.equal((await term.status()).state, "running");
  const read = async (h, want) => {
    let seen = "";
    for await (const c of h.output()) {
      seen += new TextDecoder().decode(c);
      if (want.test(seen)) break;
    }
    return seen;
  };
  await term.write("stty size; echo o''ne\n");
  assert.match(await read(term, /\bone\r?\n/), /4096 4096/);
  await term.signal("SIGTERM"); // an interactive shell ignores it
  assert.equal((await term.status()).state, "running");

  const ref = JSON.parse(JSON.stringify(term.reference()));
  assert.equal(ref.kind, "terminal");
  await term.disconnect();
  await rejects(term.write("x"), "DETACHED");
  await rejects(sandbox.processes.reopen(ref), "INVALID_ARGUMENT"); // a terminal's reference is not a process's
  const back = await sandbox.terminals.reopen(ref);
  await back.resize({ columns: 100, rows: 30 });
  await back.write("stty size; echo t''wo\n");
  const after = await read(back, /\btwo\r?\n/);
  assert.doesNotMatch(after, /\bone\r?\n/, "output before the reference was repeated");
  assert.match(after, /30 100/);
  assert.deepEqual(await back.terminate(), { status: "requested" });
  assert.equal((await back.wait()).signal, "SIGKILL");
  assert.equal((await back.status()).state, "exited");
  await back.detach();
});

test("outputComplete: false from a wait before the output drained, true from one after; earlier results unchanged", async () => {
  const child = await sandbox.processes.start({ command: sh("echo a; echo b >&2"), output: { mode: "stream" } });
  const early = await child.wait(); // nothing read yet
  assert.equal(early.outputComplete, false);
  const out = await collect(child);
  assert.deepEqual([out.stdout, out.stderr], ["a\n", "b\n"]);
  const late = await child.wait();
  assert.equal(late.outputComplete, true);
  assert.equal(early.outputComplete, false);
  assert.deepEqual(early.streams.stdout, { bytes: 0, lostBytes: 0, ended: false });
  assert.deepEqual(late.streams.stdout, { bytes: 2, lostBytes: 0, ended: true });
  await child.detach();
});

test("text after a gap: the decoder starts again, a cut character one U+FFFD per byte, every byte accounted", async () => {
  const n = 1 << 20; // 3 MiB of €, three times the ring
  const child = await sandbox.processes.start({ command: sh(`i=0; while [ $i -lt ${n / 1024} ]; do i=$((i+1)); head -c 1024 /dev/zero | sed 's/\\x00/€/g'; done`), output: { mode: "stream", flow: "drop", overflow: "report" } });
  const ref = child.reference();
  await child.disconnect();
  const q = await sandbox.processes.reopen(ref);
  await q.wait();
  let text = "";
  let lost = 0;
  for await (const c of q.output()) {
    if (c.lost) lost += c.lost;
    text += c.text;
  }
  assert.ok(lost > 0);
  assert.match(text, /^\uFFFD{0,2}(€)+$/u, `begins ${JSON.stringify(text.slice(0, 4))}`);
  const replaced = text.length - text.replace(/\uFFFD/g, "").length;
  assert.equal(lost + replaced + 3 * (text.length - replaced), 3 * n);
  await q.detach();
});

test("write copies its bytes: changing them after the call changes nothing sent", async () => {
  const child = await sandbox.processes.start({ command: { kind: "argv", argv: ["cat"] }, stdin: "pipe", output: { mode: "stream" } });
  const output = collect(child);
  const buf = new TextEncoder().encode("abc\n");
  const writing = child.write(buf);
  buf.fill(0x7a);
  await writing;
  await child.closeStdin();
  assert.equal((await output).stdout, "abc\n");
  await child.detach();
});

test("exec: stdin over 64 KiB split into writes, then EOF; an abort ends the observation only", async () => {
  const stdin = new Uint8Array(3 * LIMITS.maxWriteBytes + 7);
  for (let i = 0; i < stdin.length; i++) stdin[i] = (i * 7) % 256;
  const r = await sandbox.exec({ command: sh("cat >/tmp/in; wc -c </tmp/in; md5sum </tmp/in >&2"), stdin }, { onOutput: () => {} });
  assert.equal(r.stdout.trim(), String(stdin.length));
  const { createHash } = await import("node:crypto");
  assert.equal(r.stderr.split(" ")[0], createHash("md5").update(stdin).digest("hex"));

  const marker = "exec-abort-" + Math.random().toString(36).slice(2);
  const ac = new AbortController();
  const seen = [];
  const err = await sandbox.exec({ command: sh(`echo ${marker}; sleep 30`) }, {
    signal: ac.signal,
    onOutput: (c) => {
      seen.push(c.text);
      ac.abort();
    },
  }).catch((e) => e);
  assert.equal(err.code, "WAIT_ABORTED", err.message);
  assert.equal(err.output.stdout, marker + "\n");
  assert.equal(err.confirmedExit, undefined);
  assert.deepEqual(seen, [marker + "\n"]);
  // Not killed, no termination asked.
  const p = (await sandbox.processes.list()).find((x) => x.args?.some((a) => a.includes(marker)));
  assert.equal(p.state, "running");
  await sandbox.transport.call("DELETE", sandbox.path(`/exec-stream/${p.id}`));
});

test("finite mode at its bounds: maxOutputBytes 0 refused, 1 gives one byte, 1 MiB whole and one byte more refused", async () => {
  await rejects(sandbox.processes.start({ command: sh("true"), output: { maxOutputBytes: 0 } }), "INVALID_ARGUMENT");
  await rejects(sandbox.exec({ command: sh("true"), maxOutputBytes: 0 }), "INVALID_ARGUMENT");
  const read = async (child) => {
    let got = 0;
    try {
      for await (const c of child.output()) got += c.bytes.length;
      return { got };
    } catch (err) {
      return { got, code: err.code };
    }
  };
  const one = await sandbox.processes.start({ command: sh("printf ab"), output: { format: "bytes", maxOutputBytes: 1 } });
  assert.deepEqual(await read(one), { got: 1, code: "OUTPUT_CAPACITY" });
  const exact = await sandbox.processes.start({ command: sh(`head -c ${LIMITS.maxFiniteOutput} /dev/zero`), output: { format: "bytes" } });
  assert.deepEqual(await read(exact), { got: LIMITS.maxFiniteOutput });
  // The byte over the bound comes once the rest was read: none of it evicted meanwhile.
  const over = await sandbox.processes.start({ command: sh(`head -c ${LIMITS.maxFiniteOutput} /dev/zero; read x; printf z`), stdin: "pipe", output: { format: "bytes" } });
  let got = 0;
  await rejects((async () => {
    for await (const c of over.output()) {
      got += c.bytes.length;
      if (got === LIMITS.maxFiniteOutput) await over.write("\n");
    }
  })(), "OUTPUT_CAPACITY");
  assert.equal(got, LIMITS.maxFiniteOutput);
  const fifth = await sandbox.exec({ command: sh(`head -c ${LIMITS.maxFiniteOutput + 1} /dev/zero`) });
  assert.equal(fifth.stdout.length, LIMITS.maxFiniteOutput);
  assert.equal(fifth.truncated, true);
});

test("references: each mismatch refused, and nothing reopened", async () => {
  const child = await sandbox.processes.start({ command: sh("echo one; sleep 30"), stdin: "pipe", output: { mode: "stream" } });
  const closed = await sandbox.processes.start({ command: sh("sleep 30"), output: { mode: "stream" } });
  const term = await sandbox.terminals.start({ command: { kind: "argv", argv: ["sh"] } });
  const ref = JSON.parse(JSON.stringify(child.reference()));
  const tref = JSON.parse(JSON.stringify(term.reference()));
  const other = await client.sandboxes.create();
  try {
    const refused = [
      // not a process reference
      [() => sandbox.terminals.reopen(ref), "INVALID_ARGUMENT"],
      [() => sandbox.processes.reopen(tref), "INVALID_ARGUMENT"],
      [() => sandbox.processes.reopen({ ...ref, version: 2 }), "INVALID_ARGUMENT"],
      [() => sandbox.processes.reopen({ ...ref, process: "" }), "INVALID_ARGUMENT"],
      [() => sandbox.processes.reopen(null), "INVALID_ARGUMENT"],
      // another sandbox's, or its process not in this sandbox
      [() => other.processes.reopen(ref), "INVALID_ARGUMENT"],
      [() => other.processes.reopen({ ...ref, sandbox: other.id }), "NOT_FOUND"],
      // settings no handle has, or the process has not
      [() => sandbox.processes.reopen({ ...ref, format: "utf16" }), "INVALID_ARGUMENT"],
      [() => sandbox.processes.reopen({ ...ref, mode: "forever" }), "INVALID_ARGUMENT"],
      [() => sandbox.processes.reopen({ ...ref, overflow: "drop" }), "INVALID_ARGUMENT"],
      [() => sandbox.processes.reopen({ ...ref, stdin: { ...ref.stdin, offset: -1 } }), "INVALID_ARGUMENT"],
      [() => sandbox.processes.reopen({ ...ref, offsets: { stdout: 1.5 } }), "INVALID_ARGUMENT"],
      [() => sandbox.processes.reopen({ ...ref, process: term.id }), "INVALID_ARGUMENT"], // a terminal, named as a process
      [() => sandbox.terminals.reopen({ ...tref, process: child.id }), "INVALID_ARGUMENT"], // a process, named as a terminal
      [() => sandbox.processes.reopen({ ...ref, process: closed.id }), "INVALID_ARGUMENT"], // a pipe it has not
      [() => sandbox.processes.reopen({ ...ref, stdin: { ...ref.stdin, pipe: false } }), "INVALID_ARGUMENT"], // a pipe it has
      [() => sandbox.processes.reopen({ ...ref, offsets: { stdout: 1 << 20 } }), "OUT_OF_RANGE"], // beyond what it wrote
      [() => sandbox.processes.reopen({ ...ref, offsets: { terminal: 0 } }), "INVALID_ARGUMENT"],
      [() => sandbox.processes.reopen({ ...ref, stdin: { ...ref.stdin, offset: 10 } }), "OUT_OF_RANGE"], // input kilnd never took
      // expired, or living longer than a reference can
      [() => sandbox.processes.reopen({ ...ref, expiresAt: new Date(Date.now() - 1).toISOString() }), "FAILED_PRECONDITION"],
      [() => sandbox.processes.reopen({ ...ref, expiresAt: "never" }), "FAILED_PRECONDITION"],
      [() => sandbox.processes.reopen({ ...ref, expiresAt: new Date(Date.now() + 48 * 3600_000).toISOString() }), "INVALID_ARGUMENT"],
    ];
    for (const [i, [reopen, code]] of refused.entries()) {
      await assert.rejects(reopen(), (err) => {
        assert.ok(err instanceof SandkilnError, `#${i}: not a SandkilnError: ${err}`);
        assert.equal(err.code, code, `#${i}: ${err.message}`);
        return true;
      });
    }
    // The reference itself still reopens, and the process was touched by none of it.
    const back = await sandbox.processes.reopen(ref);
    await back.write("x\n");
    assert.equal((await back.status()).state, "running");
    await back.terminate();
    await back.wait();
    await back.detach();
  } finally {
    await other.destroy();
    for (const h of [closed, term]) {
      await h.terminate();
      await h.detach();
    }
    await child.detach();
  }
});

test("each chunk owns its bytes: changing one changes no other chunk, and no later read", async () => {
  const total = 100 * 1024;
  const pattern = (i) => (i * 31 + 7) % 251;
  const want = Buffer.alloc(total);
  for (let i = 0; i < total; i++) want[i] = pattern(i);
  await sandbox.files.write("/workspace/pattern.bin", want);
  const child = await sandbox.processes.start({ command: sh("cat /workspace/pattern.bin; cat /workspace/pattern.bin >&2"), output: { mode: "stream", format: "bytes" } });
  await child.wait(); // all in kilnd's ring: the chunks come in one burst
  const chunks = [];
  for await (const c of child.output()) chunks.push(c);
  assert.ok(chunks.length >= 4, `${chunks.length} chunks`);
  // Every chunk has a buffer of its own...
  assert.equal(new Set(chunks.map((c) => c.bytes.buffer)).size, chunks.length);
  // ...so scribbling over each, in turn, leaves the others as they came.
  for (const [i, c] of chunks.entries()) {
    const before = chunks.map((x) => Buffer.from(x.bytes));
    c.bytes.fill(0xff);
    for (const [j, x] of chunks.entries()) if (j !== i) assert.deepEqual(Buffer.from(x.bytes), before[j], `chunk ${j} changed with chunk ${i}`);
  }
  // A later read of the same output is the original.
  const again = await sandbox.processes.get(child.id, { format: "bytes" });
  const parts = { stdout: [], stderr: [] };
  for await (const c of again.output()) parts[c.stream].push(c.bytes);
  assert.deepEqual(Buffer.concat(parts.stdout), want);
  assert.deepEqual(Buffer.concat(parts.stderr), want);
  await again.detach();
  await child.detach();
});

test("exec: a throwing onOutput fails with its cause, the captured bytes, and the exit if it was confirmed; the process is not stopped", async () => {
  // The exit not yet known: confirmedExit undefined, output what was captured, the process left running.
  const running = "exec-throws-" + Math.random().toString(36).slice(2);
  const boom = new Error("boom");
  const err = await sandbox.exec({ command: sh(`echo ${running}; sleep 30`) }, { onOutput: () => { throw boom; } }).catch((e) => e);
  assert.ok(err instanceof SandkilnError, String(err));
  assert.equal(err.code, "INTERNAL");
  assert.equal(err.cause, boom);
  assert.equal(err.confirmedExit, undefined);
  assert.equal(err.output.stdout, running + "\n");
  assert.equal(err.output.stdoutBytes, running.length + 1);
  assert.equal(err.output.exitCode, null);
  const p = (await sandbox.processes.list()).find((x) => x.args?.some((a) => a.includes(running)));
  assert.equal(p.state, "running", "a failing callback stopped the process");
  await sandbox.transport.call("DELETE", sandbox.path(`/exec-stream/${p.id}`));

  // The exit confirmed before the callback throws: it is kept, with the output.
  const exited = "exec-exited-" + Math.random().toString(36).slice(2);
  const err2 = await sandbox.exec({ command: sh(`echo ${exited}; echo warn >&2; exit 5`) }, {
    onOutput: async (c) => {
      if (c.stream !== "stdout") return;
      const q = (await sandbox.processes.list()).find((x) => x.args?.some((a) => a.includes(exited)));
      await sandbox.transport.call("GET", sandbox.path(`/exec-stream/${q.id}/wait`)); // it has exited
      throw boom;
    },
  }).catch((e) => e);
  assert.equal(err2.code, "INTERNAL", err2.message);
  assert.equal(err2.cause, boom);
  assert.deepEqual(err2.confirmedExit, { exitCode: 5, signal: null, oomKilled: false, outputCut: null });
  assert.equal(err2.output.exitCode, 5);
  assert.equal(err2.output.stdout, exited + "\n");
});
