// The SDK's archives, stats, captured logs, ports and image import
// against a real kilnd.

import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";

import { Client, SandkilnError } from "../dist/index.js";
import { sandboxSuite } from "./suite.mjs";

let kilnd, client, sandbox;
sandboxSuite((s) => ({ kilnd, client, sandbox } = s), { removeLogs: true });

const sh = (script) => ({ kind: "argv", argv: ["sh", "-c", script] });
const enc = (s) => new TextEncoder().encode(s);
const dec = (b) => new TextDecoder().decode(b);

async function rejects(p, code, check) {
  await assert.rejects(p, (err) => {
    assert.ok(err instanceof SandkilnError, `not a SandkilnError: ${err}`);
    assert.equal(err.code, code, err.message);
    check?.(err);
    return true;
  });
}

function concat(parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

async function drain(stream) {
  const parts = [];
  const reader = stream.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return concat(parts);
    parts.push(value);
  }
}

const allBytes = Uint8Array.from({ length: 256 }, (_, i) => i);

// A minimal tar: ustar headers written, ustar and PAX (path) read.

function header(name, { size = 0, type = "0", mode = 0o644 } = {}) {
  const h = new Uint8Array(512);
  const put = (at, len, s) => h.set(enc(s).subarray(0, len), at);
  const octal = (at, len, n) => put(at, len, n.toString(8).padStart(len - 1, "0") + "\0");
  assert.ok(name.length <= 100, name);
  put(0, 100, name);
  octal(100, 8, mode);
  octal(108, 8, 0);
  octal(116, 8, 0);
  octal(124, 12, size);
  octal(136, 12, Math.floor(Date.parse("2024-05-06T07:08:09Z") / 1000));
  h.fill(0x20, 148, 156); // the checksum's field counts as spaces
  put(156, 1, type);
  put(257, 6, "ustar\0");
  put(263, 2, "00");
  let sum = 0;
  for (const b of h) sum += b;
  put(148, 8, sum.toString(8).padStart(6, "0") + "\0 ");
  return h;
}

/** A tar of entries: { name, body } files, { name, dir: true } directories. */
function makeTar(entries) {
  const parts = [];
  for (const e of entries) {
    if (e.dir) {
      parts.push(header(e.name, { type: "5", mode: 0o755 }));
      continue;
    }
    const body = typeof e.body === "string" ? enc(e.body) : e.body;
    parts.push(header(e.name, { size: body.length }), body, new Uint8Array((512 - (body.length % 512)) % 512));
  }
  parts.push(new Uint8Array(1024));
  return concat(parts);
}

/** A tar's entries: { name, type, body }, PAX path records applied. */
function readTar(tar) {
  const out = [];
  const str = (b) => dec(b.subarray(0, b.indexOf(0) < 0 ? b.length : b.indexOf(0)));
  let pax = {};
  for (let at = 0; at + 512 <= tar.length;) {
    const h = tar.subarray(at, at + 512);
    if (h.every((b) => b === 0)) break;
    let sum = 0;
    for (let i = 0; i < 512; i++) sum += i >= 148 && i < 156 ? 0x20 : h[i];
    assert.equal(parseInt(str(h.subarray(148, 156)).trim(), 8), sum, "a header's checksum");
    const size = parseInt(str(h.subarray(124, 136)).trim() || "0", 8);
    const type = String.fromCharCode(h[156] || 0x30);
    const prefix = dec(h.subarray(257, 263)).startsWith("ustar") ? str(h.subarray(345, 500)) : "";
    const body = tar.slice(at + 512, at + 512 + size);
    at += 512 + Math.ceil(size / 512) * 512;
    if (type === "x") {
      for (let text = dec(body); text;) {
        const sp = text.indexOf(" ");
        const len = Number(text.slice(0, sp));
        const [k, ...v] = text.slice(sp + 1, len - 1).split("=");
        pax[k] = v.join("=");
        text = text.slice(len);
      }
      continue;
    }
    if (type === "g") continue;
    const name = pax.path ?? (prefix ? prefix + "/" : "") + str(h.subarray(0, 100));
    out.push({ name, type, body });
    pax = {};
  }
  return out;
}

test("archive: a directory's tar, its names and contents; one file's; what is not there is NOT_FOUND", async () => {
  await sandbox.files.write("/workspace/arc/a.txt", "alpha\n");
  await sandbox.files.write("/workspace/arc/sub/b.bin", allBytes);
  await sandbox.files.mkdir("/workspace/arc/sub/empty");
  const { info, body } = await sandbox.files.archive("/workspace/arc");
  assert.equal(info.name, "arc");
  assert.equal(info.type, "dir");
  const entries = readTar(await drain(body));
  const byName = Object.fromEntries(entries.map((e) => [e.name.replace(/\/$/, ""), e]));
  assert.deepEqual(Object.keys(byName).sort(), ["arc", "arc/a.txt", "arc/sub", "arc/sub/b.bin", "arc/sub/empty"]);
  assert.equal(byName["arc/sub"].type, "5");
  assert.equal(byName["arc/sub/empty"].type, "5");
  assert.equal(dec(byName["arc/a.txt"].body), "alpha\n");
  assert.deepEqual(byName["arc/sub/b.bin"].body, allBytes);

  const one = await sandbox.files.archive("/workspace/arc/a.txt");
  assert.equal(one.info.type, "file");
  assert.equal(one.info.size, 6);
  const single = readTar(await drain(one.body));
  assert.deepEqual(single.map((e) => [e.name, dec(e.body)]), [["a.txt", "alpha\n"]]);

  await rejects(sandbox.files.archive("/workspace/no-such"), "NOT_FOUND", (e) => assert.equal(e.status, 404));
  await rejects(sandbox.files.archive("relative"), "INVALID_ARGUMENT");
});

test("extract: a tar built here, as bytes, a Blob and a stream, read back file by file", async () => {
  const tar = makeTar([
    { name: "x.txt", body: "ex\n" },
    { name: "d/", dir: true },
    { name: "d/y.bin", body: allBytes },
  ]);
  for (const [dir, body] of [
    ["/workspace/ext-bytes", tar],
    ["/workspace/ext-blob", new Blob([tar])],
    ["/workspace/ext-stream", new ReadableStream({
      start(c) {
        // In pieces that cut headers: the server reads a stream, not one buffer.
        for (let i = 0; i < tar.length; i += 700) c.enqueue(tar.slice(i, i + 700));
        c.close();
      },
    })],
  ]) {
    await sandbox.files.mkdir(dir);
    const info = await sandbox.files.extract(dir, body);
    assert.equal(info.type, "dir", dir);
    assert.equal(await sandbox.files.readText(dir + "/x.txt"), "ex\n", dir);
    assert.deepEqual(await sandbox.files.read(dir + "/d/y.bin"), allBytes, dir);
    assert.deepEqual((await sandbox.files.list(dir)).map((f) => f.name).sort(), ["d", "x.txt"], dir);
  }
  await rejects(sandbox.files.extract("/workspace/ext-none", tar), "NOT_FOUND");
  await sandbox.files.mkdir("/workspace/ext-bad");
  await rejects(sandbox.files.extract("/workspace/ext-bad", makeTar([{ name: "../out.txt", body: "no" }])), "PERMISSION_DENIED",
    (e) => assert.equal(e.status, 403));
  await rejects(sandbox.files.stat("/workspace/out.txt"), "NOT_FOUND");
});

test("stats: a running sandbox's figures", async () => {
  const child = await sandbox.processes.start({ command: sh("read x"), stdin: "pipe" });
  try {
    const st = await sandbox.stats();
    const top = await sandbox.top();
    assert.equal(top[0].pid, 1, "the agent");
    assert.ok(top.some((p) => p.command.endsWith("read x") && p.ppid === 1), JSON.stringify(top));
    assert.ok(st.memory_bytes > 0, `memory_bytes ${st.memory_bytes}`);
    assert.ok(st.pids >= 2, `pids ${st.pids}: the agent and sh at least`);
    assert.ok(st.cpu_seconds >= 0 && Number.isFinite(st.cpu_seconds), `cpu_seconds ${st.cpu_seconds}`);
    assert.ok(Math.abs(Date.parse(st.read_at) - Date.now()) < 60_000, `read_at ${st.read_at}`);
    assert.ok(st.processes >= 1, `processes ${st.processes}`);
  } finally {
    await child.closeStdin();
    await child.wait();
    await child.detach();
  }
  const other = await client.sandboxes.create();
  await other.destroy();
  await rejects(other.stats(), "NOT_FOUND");
});

test("stop, start, restart: files kept, processes refused while stopped, 304s described, a bad timeout refused here", async () => {
  const sb = await client.sandboxes.create();
  try {
    await sb.files.write("/workspace/kept", "kept\n");
    const stopped = await sb.stop({ timeoutSeconds: 0 });
    assert.equal(stopped.state, "stopped");
    assert.equal(stopped.reason, "stopped by request");
    assert.equal(sb.info.state, "stopped");
    const again = await sb.stop();
    assert.equal(again.state, "stopped");
    assert.equal(again.stopped_at, stopped.stopped_at);
    await rejects(sb.exec({ command: sh("true") }), "FAILED_PRECONDITION");
    const started = await sb.start();
    assert.equal(started.state, "running");
    assert.equal(started.id, sb.id);
    assert.ok(started.agent_pid > 0 && started.agent_pid !== stopped.agent_pid, `agent_pid ${started.agent_pid}`);
    assert.equal(await sb.files.readText("/workspace/kept"), "kept\n");
    assert.equal((await sb.start()).agent_pid, started.agent_pid);
    const restarted = await sb.restart({ timeoutSeconds: 1 });
    assert.equal(restarted.state, "running");
    assert.notEqual(restarted.agent_pid, started.agent_pid);
    assert.equal(await sb.files.readText("/workspace/kept"), "kept\n");
    for (const bad of [-1, 601, 1.5]) {
      await rejects(sb.stop({ timeoutSeconds: bad }), "INVALID_ARGUMENT");
    }
  } finally {
    await sb.destroy({ removeLogs: true });
  }
});

test("snapshots: taken, rolled back to, forked, a sandbox from one, exported and imported, removed", async () => {
  const sb = await client.sandboxes.create();
  const made = [];
  try {
    await sb.files.write("/workspace/state", "good\n");
    const snap = await sb.snapshot({ name: `ts-${sb.id.slice(0, 8)}` });
    assert.equal(snap.sandbox, sb.id);
    assert.match(snap.id, /^[0-9a-f]{64}$/);
    assert.ok(["reflink", "copy"].includes(snap.copy), snap.copy);
    assert.ok(snap.processes.length >= 0);
    assert.deepEqual((await sb.snapshots()).map((s) => s.id), [snap.id]);
    await sb.files.write("/workspace/state", "broken\n");
    const back = await sb.rollback(snap.name, { timeoutSeconds: 0 });
    assert.equal(back.state, "running");
    assert.equal(await sb.files.readText("/workspace/state"), "good\n");
    const forks = await sb.fork({ count: 2, labels: { try: "1" } });
    made.push(...forks);
    assert.equal(forks.length, 2);
    for (const f of forks) {
      assert.equal(f.info.labels.try, "1");
      assert.equal(await f.files.readText("/workspace/state"), "good\n");
    }
    await forks[0].files.write("/workspace/state", "fork 0\n");
    assert.equal(await forks[1].files.readText("/workspace/state"), "good\n");
    const from = await client.sandboxes.create({ snapshot: snap.id.slice(0, 12) });
    made.push(from);
    assert.equal(await from.files.readText("/workspace/state"), "good\n");
    const tar = await drain(await client.snapshots.export(snap.id));
    assert.ok(tar.length > 1024, `a tar of ${tar.length} bytes`);
    await rejects(client.snapshots.import(tar), "ALREADY_EXISTS");
    await client.snapshots.remove(snap.id);
    await rejects(client.snapshots.get(snap.id), "NOT_FOUND");
    const back2 = await client.snapshots.import(tar);
    assert.equal(back2.id, snap.id);
    assert.ok((await client.snapshots.list({ sandbox: sb.id })).some((s) => s.id === snap.id));
    await client.snapshots.remove(snap.id);
    await rejects(sb.rollback(snap.id), "NOT_FOUND");
    await rejects(sb.fork({ count: 65 }), "INVALID_ARGUMENT");
  } finally {
    for (const m of made) await m.destroy({ removeLogs: true });
    await sb.destroy({ removeLogs: true });
  }
});

test("pause, resume: paused described, a process refused PAUSED, 304s described, exec again once resumed", async () => {
  const sb = await client.sandboxes.create();
  try {
    const paused = await sb.pause();
    assert.equal(paused.state, "paused");
    assert.ok(paused.paused_at, "paused_at");
    assert.equal(sb.info.state, "paused");
    const again = await sb.pause();
    assert.equal(again.state, "paused");
    assert.equal(again.paused_at, paused.paused_at);
    await rejects(sb.exec({ command: sh("true") }), "PAUSED");
    const resumed = await sb.resume();
    assert.equal(resumed.state, "running");
    assert.equal(resumed.paused_at, undefined);
    assert.equal((await sb.resume()).state, "running");
    const res = await sb.exec({ command: sh("echo resumed") });
    assert.equal(res.stdout, "resumed\n");
  } finally {
    await sb.destroy({ removeLogs: true });
  }
});

/** A record's bytes as written: its content, and the newline that ended it unless it is partial. */
function recordBytes(r) {
  const content = r.base64 !== undefined ? Uint8Array.from(atob(r.base64), (c) => c.charCodeAt(0)) : enc(r.text ?? "");
  return r.partial ? content : concat([content, enc("\n")]);
}

test("logs: a captured process listed, read as its exact bytes, as records of the right streams", async () => {
  const child = await sandbox.processes.start({
    command: sh("printf 'out-1\\n'; printf 'err-1\\n' >&2; printf 'bin:\\377\\376\\000\\n'; printf 'err-2\\n' >&2"),
    capture: true,
  });
  assert.equal((await child.wait()).exitCode, 0);
  await child.detach();
  const stdout = concat([enc("out-1\nbin:"), Uint8Array.of(0xff, 0xfe, 0), enc("\n")]);
  const stderr = enc("err-1\nerr-2\n");

  // From the log alone, followed until the log says the process ended.
  assert.deepEqual(await drain(await sandbox.logs.read(child.id, { stream: "stdout", source: "log", follow: true })), stdout);
  assert.deepEqual(await drain(await sandbox.logs.read(child.id, { stream: "stderr", source: "log" })), stderr);
  // The best source (the running sandbox's ring) gives the same bytes.
  assert.deepEqual(await drain(await sandbox.logs.read(child.id, { stream: "stdout" })), stdout);
  const both = await drain(await sandbox.logs.read(child.id));
  assert.equal(both.length, stdout.length + stderr.length);

  const list = await sandbox.logs.list();
  const mine = list.find((l) => l.process === child.id);
  assert.ok(mine, JSON.stringify(list));
  assert.equal(mine.complete, true, JSON.stringify(mine));
  assert.ok(mine.runs.length >= 1 && mine.runs.every((r) => r.state === "lossless"), JSON.stringify(mine.runs));

  const records = [];
  for await (const r of sandbox.logs.records(child.id)) records.push(r);
  assert.ok(records.every((r) => !Number.isNaN(Date.parse(r.time))), JSON.stringify(records));
  const of = (s) => concat(records.filter((r) => r.stream === s).map(recordBytes));
  assert.deepEqual(of("stdout"), stdout);
  assert.deepEqual(of("stderr"), stderr);
  assert.ok(records.some((r) => r.stream === "stdout" && r.base64 !== undefined), "invalid UTF-8 comes as base64");

  const last = [];
  for await (const r of sandbox.logs.records(child.id, { stream: "stderr", tail: 1 })) last.push(r);
  assert.deepEqual(last.map((r) => [r.stream, dec(recordBytes(r))]), [["stderr", "err-2\n"]]);

  await rejects(sandbox.logs.read("01a22779-5cfd-7451-9354-2e19949d5c7f"), "NOT_FOUND");
  await rejects(sandbox.logs.read(child.id, { tail: -1 }), "INVALID_ARGUMENT");
});

test("logs: follow on a running process goes on with what it writes and ends once it exits", async () => {
  const child = await sandbox.processes.start({ command: sh("echo first; read x; echo second $x"), stdin: "pipe", capture: true });
  const reader = (await sandbox.logs.read(child.id, { follow: true })).getReader();
  let got = "";
  while (!got.includes("first\n")) {
    const { value, done } = await reader.read();
    assert.ok(!done, `ended before the process did: ${JSON.stringify(got)}`);
    got += dec(value);
  }
  await child.write("go\n"); // read takes it, and the process exits
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    got += dec(value);
  }
  assert.equal(got, "first\nsecond go\n");
  assert.equal((await child.status()).state, "exited");
  await child.wait();
  await child.detach();
});

test("logs: a read aborted by its signal is WAIT_ABORTED", async () => {
  const child = await sandbox.processes.start({ command: sh("echo once; read x"), stdin: "pipe", capture: true });
  const ac = new AbortController();
  const reader = (await sandbox.logs.read(child.id, { follow: true, signal: ac.signal })).getReader();
  assert.equal(dec((await reader.read()).value), "once\n");
  const next = reader.read();
  ac.abort();
  await rejects(next, "WAIT_ABORTED");
  await child.closeStdin();
  await child.wait();
  await child.detach();
});

/** Starts python3 -u with script; resolves once it printed ready, with its handle. */
async function serve(script) {
  const child = await sandbox.processes.start({
    command: { kind: "argv", argv: ["/usr/bin/python3", "-u", "-c", script] }, output: { mode: "stream" },
  });
  let out = "";
  for await (const c of child.output()) {
    out += c.text;
    if (out.includes("ready\n")) break;
  }
  assert.ok(out.includes("ready\n"), `the server did not start: ${out}`);
  return child;
}

test("ports.fetch: a file through kilnd's proxy, a redirect not followed, a closed port bad_gateway", async () => {
  await sandbox.files.write("/workspace/www/hello.txt", "hello through the proxy\n");
  await sandbox.files.mkdir("/workspace/www/sub");
  const server = await serve(`
import functools, http.server
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/workspace/www")
s = http.server.ThreadingHTTPServer(("127.0.0.1", 8000), h)
print("ready")
s.serve_forever()
`);
  try {
    const resp = await sandbox.ports.fetch(8000, "/hello.txt");
    assert.equal(resp.status, 200);
    assert.equal(await resp.text(), "hello through the proxy\n");
    const missing = await sandbox.ports.fetch(8000, "nope.txt?x=1");
    assert.equal(missing.status, 404, "the app's own 404 is an answer, not an error");
    assert.equal(missing.headers.get("kiln-error"), null);
    await missing.arrayBuffer();
    const moved = await sandbox.ports.fetch(8000, "/sub");
    assert.equal(moved.status, 301);
    assert.match(moved.headers.get("location") ?? "", new RegExp(`/sandboxes/${sandbox.id}/ports/8000/sub/$`));
    await moved.arrayBuffer();
    const head = await sandbox.ports.fetch(8000, "/hello.txt", { method: "HEAD" });
    assert.equal(head.headers.get("content-length"), "24");
    const post = await sandbox.ports.fetch(8000, "/hello.txt", { method: "POST", body: "x" });
    assert.equal(post.status, 501, "the app refuses POST: its answer, not an error");
    await post.arrayBuffer();
  } finally {
    await server.terminate();
    await server.wait();
    await server.detach();
  }
  await rejects(sandbox.ports.fetch(8001, "/"), "UNAVAILABLE", (e) => {
    assert.equal(e.status, 502);
    assert.equal(e.kilnCode, "bad_gateway");
  });
  await rejects(sandbox.ports.fetch(0, "/"), "INVALID_ARGUMENT");
});

test("ports.connect: a TCP echo round-trips every byte value and 1 MiB; a closed port is bad_gateway", async () => {
  const server = await serve(`
import socket
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 9000))
l.listen(4)
print("ready")
while True:
    c, _ = l.accept()
    while True:
        b = c.recv(65536)
        if not b:
            break
        if b == b"bye\\n":
            c.sendall(b"bye\\n")
            break
        c.sendall(b)
    c.close()
`);
  try {
    const conn = await sandbox.ports.connect(9000);
    const big = new Uint8Array(1 << 20);
    for (let i = 0; i < big.length; i++) big[i] = (i * 7 + (i >> 9)) & 0xff;
    const want = concat([allBytes, big]);
    const reading = (async () => {
      const parts = [];
      let n = 0;
      for await (const b of conn.readable) {
        parts.push(b);
        n += b.length;
        if (n >= want.length) break;
      }
      return concat(parts);
    })();
    await conn.write(allBytes);
    await conn.write(big);
    assert.deepEqual(await reading, want);
    // A loop left early leaves the connection open: reading again goes on.
    await conn.write("again");
    for await (const b of conn.readable) {
      assert.equal(dec(b), "again");
      break;
    }
    await conn.close();
    await conn.closed;
    await rejects(conn.write("late"), "DETACHED");

    // The server closing ends the readable.
    const second = await sandbox.ports.connect(9000);
    await second.write("bye\n");
    let said = "";
    for await (const b of second.readable) said += dec(b);
    assert.equal(said, "bye\n");
    await second.closed;
    await rejects(second.write("more"), "UNAVAILABLE");

    // client.close() closes the connections made through the client.
    const other = new Client({ url: kilnd.url, token: kilnd.token });
    const third = await (await other.sandboxes.get(sandbox.id)).ports.connect(9000);
    await third.write("ping");
    for await (const b of third.readable) {
      assert.equal(dec(b), "ping");
      break;
    }
    await other.close();
    await third.closed;
    await rejects(third.write("after close"), "DETACHED");
  } finally {
    await server.terminate();
    await server.wait();
    await server.detach();
  }
  await rejects(sandbox.ports.connect(9001), "UNAVAILABLE", (e) => {
    assert.equal(e.status, 502);
    assert.equal(e.kilnCode, "bad_gateway");
  });
});

function sha256(b) {
  return createHash("sha256").update(b).digest("hex");
}

/** The smallest docker save tar: one image, one layer of one file. */
function dockerSave(name) {
  const layer = makeTar([{ name: "data/", dir: true }, { name: "data/hello.txt", body: "from the imported layer\n" }]);
  const arch = { x64: "amd64", arm64: "arm64" }[process.arch] ?? process.arch;
  const config = enc(JSON.stringify({
    architecture: arch, os: "linux", created: "2024-05-06T07:08:09Z",
    config: { Env: ["PATH=/usr/bin:/bin"], Cmd: ["/bin/sh"] },
    rootfs: { type: "layers", diff_ids: ["sha256:" + sha256(layer)] },
  }));
  const configName = sha256(config) + ".json";
  const manifest = JSON.stringify([{ Config: configName, RepoTags: [name], Layers: ["layer/layer.tar"] }]);
  return { id: "sha256:" + sha256(config), tar: makeTar([
    { name: "manifest.json", body: manifest },
    { name: configName, body: config },
    { name: "layer/", dir: true },
    { name: "layer/layer.tar", body: layer },
  ]) };
}

test("images.import: a docker save tar built here, listed, a sandbox from it reads its file, removed", async () => {
  const name = "example.test/sdk-import:1";
  const { id, tar } = dockerSave(name);
  const seen = [];
  const images = await client.images.import(tar, { onProgress: (p) => seen.push(p.status) });
  assert.equal(images.length, 1);
  assert.equal(images[0].id, id);
  assert.deepEqual(images[0].names, [name]);
  assert.equal(images[0].layers.length, 1);
  assert.deepEqual(seen.slice(-1), ["done"]);
  assert.ok(seen.includes("unpacking"), seen.join(" "));
  assert.ok((await client.images.list()).some((i) => i.id === id));

  // Again, as a stream: the layer is kept already.
  seen.length = 0;
  const again = await client.images.import(new ReadableStream({
    start(c) {
      c.enqueue(tar);
      c.close();
    },
  }), { onProgress: (p) => seen.push(p.status) });
  assert.equal(again[0].id, id);
  assert.ok(seen.includes("exists"), seen.join(" "));

  const sb = await client.sandboxes.create({ image: name });
  try {
    assert.equal(sb.info.image_id, id);
    assert.equal(await sb.files.readText("/data/hello.txt"), "from the imported layer\n");
  } finally {
    await sb.destroy({ removeLogs: true });
  }
  await client.images.remove(name);
  await rejects(client.images.get(name), "NOT_FOUND");
  await rejects(client.images.import(enc("not a tar")), "INVALID_ARGUMENT");
});

test("errors: kilnd's answers carry one prefix, the SDK's", async () => {
  const wrong = new Client({ url: kilnd.url, token: "wrong" });
  try {
    // Each made as it is awaited: a rejection left waiting is unhandled.
    const refusals = [
      [() => wrong.sandboxes.list(), "UNAUTHENTICATED"],
      [() => client.sandboxes.create({ limits: { pids: 2 ** 40 } }), "INVALID_ARGUMENT"],
      [() => client.sandboxes.get("no-such-sandbox"), "NOT_FOUND"],
    ];
    for (const [call, code] of refusals) {
      await rejects(call(), code, (err) => {
        assert.match(err.message, /^kilnd: /);
        assert.equal(err.message.split("kilnd: ").length, 2, err.message);
      });
    }
  } finally {
    await wrong.close();
  }
});

test("mounts: refused by a kilnd without --allow-mount, naming the flag", async () => {
  const mounts = [{ source: "/tmp", target: "/data", read_only: true }];
  await rejects(client.sandboxes.create({ mounts }), "PERMISSION_DENIED", (err) => assert.match(err.message, /--allow-mount/));
});
