// What the SDK says when it cannot know: answers lost on their way back
// from a real kilnd (a proxy cuts the connection after kilnd acted),
// answers held back, and kilnd out of reach. The seed's OUTCOME_UNKNOWN,
// INPUT_UNCERTAIN, status "unknown" and shared terminations.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";

import { Client, SandkilnError } from "../dist/index.js";
import { startKilnd } from "./kilnd.mjs";
import { startProxy } from "./proxy.mjs";

let kilnd, proxy, client, sandbox, via;

before(async () => {
  kilnd = await startKilnd();
  proxy = await startProxy(kilnd.url);
  client = new Client({ url: kilnd.url, token: kilnd.token });
  sandbox = await client.sandboxes.create();
  // The same sandbox, reached through the proxy.
  via = await new Client({ url: proxy.url, token: kilnd.token }).sandboxes.get(sandbox.id);
});

after(async () => {
  // kilnd.stop() deletes every sandbox left, whatever failed before it.
  try {
    await sandbox?.destroy();
    await client?.close();
    await proxy?.close();
  } finally {
    await kilnd?.stop();
  }
});

const sh = (script) => ({ kind: "argv", argv: ["sh", "-c", script] });
const cat = { kind: "argv", argv: ["cat"] };

async function rejects(p, code) {
  let caught;
  await assert.rejects(p, (err) => {
    assert.ok(err instanceof SandkilnError, `not a SandkilnError: ${err}`);
    assert.equal(err.code, code, err.message);
    caught = err;
    return true;
  });
  return caught;
}

function throws(f, code) {
  assert.throws(f, (err) => {
    assert.ok(err instanceof SandkilnError, `not a SandkilnError: ${err}`);
    assert.equal(err.code, code, err.message);
    return true;
  });
}

const processPath = (child, rest = "") => new RegExp(`^/sandboxes/${sandbox.id}/exec-stream/${child.id}${rest}(\\?|$)`);

/** kilnd's own account of the process, asked directly. */
const record = (child) => sandbox.transport.call("GET", sandbox.path(`/exec-stream/${child.id}`));

/** Reads child's text output until it is want; stream mode, so leaving the loop leaves the handle usable. */
async function readUntil(child, want) {
  let text = "";
  for await (const c of child.output()) {
    text += c.text;
    if (text === want) return text;
  }
  return text;
}

test("a lost terminate acknowledgement: OUTCOME_UNKNOWN, saved for every later call, nothing sent again", async () => {
  const child = await via.processes.start({ command: sh("sleep 30"), output: { mode: "stream" } });
  const del = processPath(child);
  proxy.cutAnswer("DELETE", del);
  const first = await rejects(child.terminate(), "OUTCOME_UNKNOWN");
  const second = await rejects(child.terminate(), "OUTCOME_UNKNOWN");
  assert.equal(second, first, "not the saved failure");
  await rejects(child.terminate({ signal: AbortSignal.timeout(10_000) }), "OUTCOME_UNKNOWN");
  assert.equal(proxy.count("DELETE", del), 1, proxy.requests.join("\n"));
  // kilnd did act; the handle goes on observing.
  const r = await child.wait();
  assert.equal(r.signal, "SIGKILL");
  assert.equal((await child.status()).state, "exited");
  await rejects(child.terminate(), "OUTCOME_UNKNOWN");
  assert.equal(proxy.count("DELETE", del), 1);
  await child.detach();
});

test("a lost write acknowledgement: OUTCOME_UNKNOWN, then INPUT_UNCERTAIN; never sent again; output, status, wait and terminate go on", async () => {
  const child = await via.processes.start({ command: cat, stdin: "pipe", output: { mode: "stream" } });
  const stdin = processPath(child, "/stdin");
  await child.write("one\n");
  proxy.cutAnswer("POST", stdin);
  await rejects(child.write("two\n"), "OUTCOME_UNKNOWN");
  const uncertain = await rejects(child.write("three\n"), "INPUT_UNCERTAIN");
  assert.equal(uncertain.cause.code, "OUTCOME_UNKNOWN");
  await rejects(child.write(""), "INPUT_UNCERTAIN");
  await rejects(child.closeStdin(), "INPUT_UNCERTAIN");
  throws(() => child.reference(), "INPUT_UNCERTAIN");
  assert.equal(proxy.count("POST", stdin), 2, proxy.requests.join("\n"));
  // It had taken effect: kilnd accepted it, and cat says it back.
  assert.equal((await record(child)).stdin.accepted, 8);
  assert.equal(await readUntil(child, "one\ntwo\n"), "one\ntwo\n");
  assert.equal((await child.status()).state, "running");
  assert.deepEqual(await child.terminate(), { status: "requested" });
  assert.equal((await child.wait()).signal, "SIGKILL");
  assert.equal(proxy.count("POST", stdin), 2);
  await child.detach();
});

test("a lost end-of-input acknowledgement: OUTCOME_UNKNOWN, input disabled, reference() refuses", async () => {
  const child = await via.processes.start({ command: cat, stdin: "pipe", output: { mode: "stream" } });
  const close = processPath(child, "/stdin/close");
  await child.write("x\n");
  proxy.cutAnswer("POST", close);
  await rejects(child.closeStdin(), "OUTCOME_UNKNOWN");
  await rejects(child.write("y\n"), "INPUT_UNCERTAIN");
  await rejects(child.closeStdin(), "INPUT_UNCERTAIN");
  throws(() => child.reference(), "INPUT_UNCERTAIN");
  assert.equal(proxy.count("POST", close), 1);
  // kilnd closed it: cat ends by itself.
  const r = await child.wait();
  assert.equal(r.exitCode, 0);
  assert.equal(proxy.count("POST", close), 1);
  await child.detach();
});

test("reference() refuses while end-of-input waits for its acknowledgement, and follows once it came", async () => {
  const child = await via.processes.start({ command: cat, stdin: "pipe", output: { mode: "stream" } });
  const held = proxy.hold("POST", processPath(child, "/stdin/close"));
  const closing = child.closeStdin();
  await held.answer; // kilnd closed it; the SDK has not heard
  throws(() => child.reference(), "FAILED_PRECONDITION");
  await rejects(child.write("late\n"), "STDIN_CLOSED");
  held.release();
  await closing;
  const ref = child.reference();
  assert.deepEqual(ref.stdin, { pipe: true, offset: 0, closed: true });
  assert.equal((await child.wait()).exitCode, 0);
  await child.detach();
});

test("a write cancelled while queued has no remote effect; the writes around it go in order", async () => {
  const child = await via.processes.start({ command: cat, stdin: "pipe", output: { mode: "stream" } });
  const stdin = processPath(child, "/stdin");
  const held = proxy.hold("POST", stdin);
  const first = child.write("a\n");
  const ac = new AbortController();
  const second = child.write("b\n", { signal: ac.signal });
  const third = child.write("c\n");
  await held.answer;
  ac.abort();
  await rejects(second, "WAIT_ABORTED");
  held.release();
  await first;
  await third;
  assert.equal(proxy.count("POST", stdin), 2, proxy.requests.join("\n"));
  assert.equal((await record(child)).stdin.accepted, 4);
  await child.closeStdin();
  assert.equal(await readUntil(child, "a\nc\n"), "a\nc\n");
  assert.equal((await child.wait()).exitCode, 0);
  await child.detach();
});

test("a lost start: OUTCOME_UNKNOWN, and the command never started again", async () => {
  const start = new RegExp(`^/sandboxes/${sandbox.id}/exec-stream$`);
  const marker = "lost-start-" + Math.random().toString(36).slice(2);
  const before = proxy.count("POST", start);
  proxy.cutAnswer("POST", start);
  await rejects(via.processes.start({ command: sh(`echo ${marker}; sleep 30`), output: { mode: "stream" } }), "OUTCOME_UNKNOWN");
  assert.equal(proxy.count("POST", start), before + 1);
  const started = (await sandbox.processes.list()).filter((p) => p.args?.some((a) => a.includes(marker)));
  assert.equal(started.length, 1, "it did start, once");
  await sandbox.transport.call("DELETE", sandbox.path(`/exec-stream/${started[0].id}`));

  // Abandoned after dispatch: the caller's abort while the answer is on its way.
  const again = "abandoned-start-" + Math.random().toString(36).slice(2);
  const held = proxy.hold("POST", start);
  const ac = new AbortController();
  const starting = via.processes.start({ command: sh(`echo ${again}; sleep 30`), output: { mode: "stream" }, signal: ac.signal });
  await held.answer;
  ac.abort();
  await rejects(starting, "OUTCOME_UNKNOWN");
  held.release();
  const abandoned = (await sandbox.processes.list()).filter((p) => p.args?.some((a) => a.includes(again)));
  assert.equal(abandoned.length, 1);
  await sandbox.transport.call("DELETE", sandbox.path(`/exec-stream/${abandoned[0].id}`));
});

test("status(): unknown while kilnd cannot be reached, a local handle proving nothing; a confirmed exit kept", async () => {
  const child = await via.processes.start({ command: sh("sleep 30"), output: { mode: "stream" } });
  const get = processPath(child);
  let cut = proxy.cutRequest("GET", get, Infinity);
  const st = await child.status();
  assert.equal(st.state, "unknown");
  assert.equal(st.exit, undefined);
  assert.ok(st.observedAt instanceof Date);
  assert.equal(st.error.code, "UNAVAILABLE", st.error.message);
  cut.remove();
  assert.equal((await child.status()).state, "running");

  await child.terminate();
  const r = await child.wait();
  cut = proxy.cutRequest("GET", get, Infinity);
  const after = await child.status();
  cut.remove();
  assert.equal(after.state, "exited");
  assert.deepEqual(after.exit, { exitCode: r.exitCode, signal: r.signal, oomKilled: r.oomKilled, outputCut: r.outputCut });
  assert.equal(after.error.code, "UNAVAILABLE");
  await child.detach();
});

test("wait(): a broken connection fails it as UNAVAILABLE, no exit guessed", async () => {
  const child = await via.processes.start({ command: sh("sleep 30"), output: { mode: "stream" } });
  const wait = processPath(child, "/wait");
  const cut = proxy.cutRequest("GET", wait, Infinity);
  await rejects(child.wait(), "UNAVAILABLE");
  cut.remove();
  assert.equal((await child.status()).state, "running");
  await child.terminate();
  assert.equal((await child.wait()).signal, "SIGKILL");
  await child.detach();
});

test("concurrent terminates share one request; cancelling one caller stops only its wait", async () => {
  const child = await via.processes.start({ command: sh("sleep 30"), output: { mode: "stream" } });
  const del = processPath(child);
  const held = proxy.hold("DELETE", del);
  const ac = new AbortController();
  const a = child.terminate({ signal: ac.signal });
  const b = child.terminate();
  const c = child.terminate();
  let settled = false;
  b.finally(() => (settled = true)).catch(() => {});
  await held.answer; // kilnd has answered; the answer is held
  ac.abort();
  await rejects(a, "WAIT_ABORTED");
  assert.equal(settled, false, "b ended with a");
  held.release();
  assert.deepEqual(await b, { status: "requested" });
  assert.deepEqual(await c, { status: "requested" });
  assert.equal(proxy.count("DELETE", del), 1, proxy.requests.join("\n"));
  assert.equal((await child.wait()).signal, "SIGKILL");
  assert.deepEqual(await child.terminate(), { status: "exited" });
  assert.equal(proxy.count("DELETE", del), 2);
  await child.detach();
});

test("terminate(): not-found once another client deleted the sandbox", async () => {
  const other = await client.sandboxes.create();
  const child = await other.processes.start({ command: sh("sleep 30"), output: { mode: "stream" } });
  // Another client's lifecycle call: this one's handles do not know.
  const resp = await fetch(`${kilnd.url}/sandboxes/${other.id}`, { method: "DELETE", headers: { Authorization: "Bearer " + kilnd.token } });
  assert.ok(resp.ok, `${resp.status}`);
  assert.deepEqual(await child.terminate(), { status: "not-found" });
  await child.detach();
});

/** p, or a failure saying what did not come within ms. */
function within(p, ms, what) {
  let timer;
  const late = new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)));
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** kilnd's byte count of a stream of child. */
const written = async (child, stream = "stdout") => (await record(child)).streams[stream].total_bytes;

/** Waits until kilnd's record of child satisfies ok. */
async function until(child, ok, what) {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const r = await record(child);
    if (ok(r)) return r;
    if (Date.now() > deadline) throw new Error(`${what}: not so within 20 s: ${JSON.stringify(r)}`);
    await new Promise((res) => setTimeout(res, 20));
  }
}

/**
 * Reads the first chunk of child's output, then nothing until the SDK
 * has let the output connection go (a queue that overflowed does), then
 * the rest; resolves with the bytes delivered and the error it ended with.
 */
/**
 * Reads a flow drop process's output, stalling after its first chunk until
 * the process has written total bytes (the ring keeps 1 MiB of them), then
 * on: bytes lost to the reader, which overflow "fail" reports as
 * OUTPUT_CAPACITY. Each chunk must continue the last exactly.
 */
async function overflow(child, total) {
  const it = child.output();
  let got = 0;
  try {
    const first = await it.next();
    if (!first.done) {
      assert.equal(first.value.offset, 0);
      got = first.value.bytes.length;
    }
    await until(child, (r) => r.streams.stdout.total_bytes === total, "all of the output written");
    for (;;) {
      const { value, done } = await it.next();
      if (done) return { got };
      assert.equal(value.offset, got, "a chunk repeated or skipped");
      got += value.bytes.length;
    }
  } catch (err) {
    return { got, err };
  }
}

test("closeStdin() again, or while the first is on its way, sends end-of-input once; a write after it is refused locally", async () => {
  const child = await via.processes.start({ command: cat, stdin: "pipe", output: { mode: "stream" } });
  const close = processPath(child, "/stdin/close");
  const stdin = processPath(child, "/stdin");
  await child.write("a\n");
  const held = proxy.hold("POST", close);
  const first = child.closeStdin();
  await held.answer;
  const second = child.closeStdin(); // shares the one on its way
  held.release();
  await Promise.all([first, second]);
  await child.closeStdin();
  await child.closeStdin({ signal: AbortSignal.timeout(10_000) });
  await rejects(child.write("b\n"), "STDIN_CLOSED");
  await rejects(child.write(""), "STDIN_CLOSED");
  assert.equal(proxy.count("POST", close), 1, proxy.requests.join("\n"));
  assert.equal(proxy.count("POST", stdin), 1, proxy.requests.join("\n"));
  assert.equal(await readUntil(child, "a\n"), "a\n");
  assert.equal((await child.wait()).exitCode, 0);
  assert.deepEqual((await record(child)).stdin, { accepted: 2, delivered: 2, closed: true });
  await child.detach();
});

test("OUTPUT_CAPACITY does not kill the process: it runs on, takes input, and its real exit is waited for", async () => {
  const total = 4 << 20;
  const child = await via.processes.start({
    command: sh(`head -c ${total} /dev/zero; read x; echo got-$x; exit 7`), stdin: "pipe",
    output: { mode: "stream", format: "bytes", overflow: "fail", flow: "drop" },
  });
  const { got, err } = await overflow(child, total);
  assert.equal(err?.code, "OUTPUT_CAPACITY", String(err));
  assert.ok(got < total, `${got} bytes delivered`);
  // Still running, as kilnd and the handle say; nothing asked to end it.
  await until(child, (r) => r.streams.stdout.total_bytes === total, "all of the output written");
  assert.equal((await record(child)).state, "running");
  assert.equal((await child.status()).state, "running");
  await child.write("go\n");
  const r = await child.wait();
  assert.deepEqual([r.exitCode, r.signal], [7, null]);
  assert.equal(r.outputComplete, false);
  assert.equal(await written(child), total + "got-go\n".length);
  assert.equal(proxy.count("DELETE", processPath(child)), 0);
  assert.equal(proxy.count("POST", processPath(child, "/signal")), 0);
  await child.detach();
});

test("an output error does not erase a confirmed exit: after OUTPUT_CAPACITY, and with kilnd cut off, status() and wait() give it", async () => {
  const total = 4 << 20;
  const child = await via.processes.start({ command: sh(`head -c ${total} /dev/zero; exit 5`), output: { mode: "stream", format: "bytes", overflow: "fail", flow: "drop" } });
  const exit = await child.wait();
  assert.deepEqual([exit.exitCode, exit.signal, exit.oomKilled], [5, null, false]);
  const want = { exitCode: 5, signal: null, oomKilled: false, outputCut: null };

  const { err } = await overflow(child, total);
  assert.equal(err?.code, "OUTPUT_CAPACITY", String(err));
  assert.deepEqual((await child.status()).exit, want);
  const again = await child.wait();
  assert.deepEqual([again.exitCode, again.signal, again.outputComplete], [5, null, false]);

  // Every request of this process's now cut: the output fails, the exit stays.
  const cut = proxy.cutRequest("GET", processPath(child, "(/.*)?"), Infinity);
  try {
    await rejects((async () => {
      for await (const c of child.output()) assert.fail(`output at ${c.offset} through a cut connection`);
    })(), "UNAVAILABLE");
    const st = await child.status();
    assert.equal(st.state, "exited");
    assert.deepEqual(st.exit, want);
    assert.equal(st.error.code, "UNAVAILABLE");
    const cutOff = await child.wait();
    assert.deepEqual([cutOff.exitCode, cutOff.signal, cutOff.oomKilled, cutOff.outputComplete], [5, null, false, false]);
  } finally {
    cut.remove();
  }
  assert.deepEqual(exit.exitCode, 5); // earlier results unchanged
  await child.detach();
});

// Each of these holds an answer for 30 s: on one runtime only, so that
// the suite's four runs do not each wait half a minute.
const node22 = !globalThis.Bun && !globalThis.Deno && Number(process.versions.node.split(".")[0]) >= 22;

// Held answers are timed on Node 22 only: elsewhere the test is not
// defined (Deno's runner, given a skipped test, may end the file without
// its after hook).
(node22 ? test : () => {})("30 s local timeouts: input, status, termination and setup give up on a held answer; a wait does not; the process runs on",
  async () => {
    const child = await via.processes.start({ command: cat, stdin: "pipe", output: { mode: "stream" } });
    const sleeper = await via.processes.start({ command: sh("sleep 120"), output: { mode: "stream" } });
    const quick = await via.processes.start({ command: sh("exit 3"), output: { mode: "stream" } });
    const start = new RegExp(`^/sandboxes/${sandbox.id}/exec-stream$`);
    const marker = "held-start-" + Math.random().toString(36).slice(2);
    const holds = [
      proxy.hold("POST", processPath(child, "/stdin")),
      proxy.hold("GET", processPath(sleeper)),
      proxy.hold("DELETE", processPath(sleeper)),
      proxy.hold("POST", start),
    ];
    const waitHeld = proxy.hold("GET", processPath(quick, "/wait"));
    const timed = async (p) => {
      const t0 = performance.now();
      const v = await p.then((value) => ({ value }), (error) => ({ error }));
      return { ...v, ms: performance.now() - t0 };
    };
    const waiting = timed(quick.wait());
    const [write, status, terminate, setup] = await Promise.all([
      timed(child.write("held\n")),
      timed(sleeper.status()),
      timed(sleeper.terminate()),
      timed(via.processes.start({ command: sh(`echo ${marker}; sleep 120`), output: { mode: "stream" } })),
    ]);
    for (const [what, r] of Object.entries({ write, status, terminate, setup })) {
      assert.ok(r.ms >= 29_900 && r.ms < 45_000, `${what} gave up after ${r.ms} ms`);
    }
    assert.equal(write.error?.code, "OUTCOME_UNKNOWN", String(write.error));
    assert.match(write.error.message, /no answer within 30 s/);
    await rejects(child.write("next\n"), "INPUT_UNCERTAIN");
    assert.equal(status.value?.state, "unknown", JSON.stringify(status));
    assert.equal(status.value.error.code, "UNAVAILABLE");
    assert.equal(terminate.error?.code, "OUTCOME_UNKNOWN", String(terminate.error));
    assert.equal(setup.error?.code, "OUTCOME_UNKNOWN", String(setup.error));
    for (const h of holds) await h.answer; // kilnd did answer each, all along
    // The wait has no timeout: it is still waiting, and the held answer, once let through, is its exit.
    let waited = false;
    waiting.then(() => (waited = true));
    await new Promise((r) => setImmediate(r));
    assert.equal(waited, false, "the wait gave up");
    await waitHeld.answer;
    waitHeld.release();
    const w = await waiting;
    assert.equal(w.value?.exitCode, 3, String(w.error));
    assert.ok(w.ms >= 29_900);
    // The timeouts limited the requests, not the processes: kilnd took the
    // write and the start, and the sleeper was killed by the terminate
    // whose answer was lost, not by any timeout.
    assert.equal((await record(child)).stdin.accepted, "held\n".length);
    assert.equal((await record(child)).state, "running");
    const started = (await sandbox.processes.list()).filter((p) => p.args?.some((a) => a.includes(marker)));
    assert.equal(started.length, 1);
    assert.equal(started[0].state, "running");
    assert.equal((await record(sleeper)).signal, "KILL");
    await sandbox.transport.call("DELETE", sandbox.path(`/exec-stream/${started[0].id}`));
    await sandbox.transport.call("DELETE", sandbox.path(`/exec-stream/${child.id}`));
    for (const h of [child, sleeper, quick]) await h.detach();
  });

test("detach(): unread output discarded, connections let go, no kill asked; again is safe; the process and its output stay kilnd's", async () => {
  const total = 200 * 1024;
  const child = await via.processes.start({ command: sh(`head -c ${total} /dev/zero; exec sleep 30`), stdin: "pipe", output: { mode: "stream", format: "bytes" } });
  await until(child, (r) => r.streams.stdout.total_bytes === total, "all of the output written");
  const it = child.output();
  const first = await it.next();
  assert.ok(first.value.bytes.length > 0 && first.value.bytes.length < total);
  await child.detach();
  // Nothing more is given, although most of the output was never read.
  await rejects(it.next(), "DETACHED");
  await within(proxy.hungUp("GET", processPath(child, "/logs")), 20_000, "the output connection let go");
  await child.detach();
  await rejects(child.write("x"), "DETACHED");
  await rejects(child.closeStdin(), "DETACHED");
  await rejects(child.wait(), "DETACHED");
  await rejects(child.terminate(), "DETACHED");
  throws(() => child.reference(), "DETACHED");
  assert.equal(proxy.count("DELETE", processPath(child)), 0);
  assert.equal(proxy.count("POST", processPath(child, "/signal")), 0);
  assert.equal(proxy.count("POST", processPath(child, "/stdin/close")), 0);
  // kilnd's process runs on, and its output is there for another handle, whole.
  const r = await record(child);
  assert.equal(r.state, "running");
  assert.equal(r.stdin.closed, false);
  const again = await sandbox.processes.get(child.id, { format: "bytes" });
  let got = 0;
  for await (const c of again.output()) {
    got += c.bytes.length;
    if (got === total) break;
  }
  assert.equal(got, total);
  await again.terminate();
  await again.wait();
  await again.detach();
});
