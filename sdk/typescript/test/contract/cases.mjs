// The streaming contract, one case per sentence of the seed ("Streaming and
// interactive processes") that states behaviour, each named by its
// sentence. The same cases run under node:test on Node 20, Node 22,
// Bun and Deno (contract.test.mjs), and in Chromium (browser.test.mjs).
//
// A case gets t: { client, sandbox, kilnd: { url, token } } and, where a
// runner can make them (not a browser page), t.proxy, a proxy between the
// SDK and kilnd that can cut or hold answers, and t.via, the same sandbox
// reached through it. A case that needs them says so (needs: "proxy"); one
// that holds an answer for the seed's 30 s runs on one runtime (needs:
// "slow"). Where sandkiln does better than the seed on purpose, the case
// asserts the better behaviour and says how in deviation; the README lists
// them.

import { createProcessTail, LIMITS, readProcessLines, SandkilnError } from "../../dist/index.js";
import { deep, eq, isError, ok, rejects, throws, within } from "./check.mjs";

export const sh = (script) => ({ kind: "argv", argv: ["sh", "-c", script] });
const cat = { kind: "argv", argv: ["cat"] };
const decode = (b) => new TextDecoder().decode(b);
const encode = (s) => new TextEncoder().encode(s);
const stream = { mode: "stream" };
const tick = (ms) => new Promise((r) => setTimeout(r, ms));

/** Reads a handle's output to its end. */
async function collect(child, options) {
  const out = { stdout: "", stderr: "", lost: 0, chunks: [] };
  for await (const c of child.output(options)) {
    out.chunks.push(c);
    if (c.lost) out.lost += c.lost;
    else out[c.stream] += c.text ?? decode(c.bytes);
  }
  return out;
}

/** Reads a handle's output until its text holds want; leaves the loop there. */
async function readUntil(child, want) {
  let seen = "";
  for await (const c of child.output()) {
    seen += c.text ?? decode(c instanceof Uint8Array ? c : c.bytes);
    if (seen.includes(want)) return seen;
  }
  return seen;
}

/** kilnd's own account of a process, asked directly. */
const record = (t, child) => t.sandbox.transport.call("GET", t.sandbox.path(`/exec-stream/${child.id}`));

/** Asks kilnd about a process until pred holds (a bounded poll of real state). */
async function until(t, child, pred, what) {
  for (const deadline = Date.now() + 30_000; Date.now() < deadline; await tick(10)) {
    if (pred(await record(t, child))) return;
  }
  throw new Error(`${what}: not within 30 s`);
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

async function sha256(bytes) {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return [...d].map((x) => x.toString(16).padStart(2, "0")).join("");
}

const processPath = (t, child, rest = "") => new RegExp(`^/sandboxes/${t.sandbox.id}/exec-stream/${child.id}${rest}(\\?|$)`);

/** A chunk as readProcessLines and createProcessTail take it. */
const chunk = (s, text) => ({ stream: s, text, offset: 0, seq: 0, lost: 0 });

/**
 * A burst of n random bytes on stdout, written as fast as the program can,
 * its SHA-256 first on stderr; resolves with whether what came matched.
 */
async function burst(t, n, read) {
  const child = await t.sandbox.processes.start({
    command: sh(`head -c ${n} /dev/urandom > /tmp/burst.$$ && sha256sum < /tmp/burst.$$ >&2 && cat /tmp/burst.$$; rm -f /tmp/burst.$$`),
    output: { mode: "stream", format: "bytes" },
  });
  const parts = [];
  let err = "";
  let error;
  try {
    for await (const c of child.output()) {
      if (c.stream === "stdout") {
        await read?.(c, parts.reduce((a, p) => a + p.length, 0));
        parts.push(c.bytes);
      } else err += decode(c.bytes);
    }
  } catch (e) {
    error = e;
  }
  const got = concat(parts);
  const r = error ? undefined : await child.wait();
  await child.detach();
  return { got, want: err.split(" ")[0], sum: await sha256(got), error, result: r };
}

export const cases = [
  // The seed's example, as written.
  {
    section: "processes.start",
    sentence: "The example reads output while sending requests, closes stdin when there is no more input, and waits for both output and exit.",
    async run(t) {
      const child = await t.sandbox.processes.start({
        command: { kind: "argv", argv: ["sh", "-c", "while read l; do echo \"done: $l\"; done"] },
        stdin: "pipe",
        output: { mode: "stream" },
      });
      let seen = "";
      const output = (async () => {
        for await (const chunk of child.output()) {
          eq(chunk.stream, "stdout");
          seen += chunk.text;
        }
      })();
      const completion = Promise.allSettled([output, child.wait()]);
      let status;
      let done;
      try {
        await child.write("first request\n");
        await child.write(new TextEncoder().encode("second request\n"));
        await child.closeStdin();
        status = await child.status();
        done = await completion;
      } finally {
        await child.detach();
      }
      ok(["running", "exited"].includes(status.state), status.state);
      eq(done[0].status, "fulfilled");
      eq(done[1].status, "fulfilled");
      eq(done[1].value.exitCode, 0);
      eq(seen, "done: first request\ndone: second request\n");
    },
  },
  {
    section: "processes.start",
    sentence: "Output defaults to UTF-8 text, with separate stdout and stderr.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("printf 'h\\303\\251 '; printf x >&2; printf '\\342\\202'; printf '\\254\\n'"), output: stream });
      const out = await collect(child);
      eq(out.stdout, "hé €\n");
      eq(out.stderr, "x");
      ok(out.chunks.every((c) => typeof c.text === "string" && !("bytes" in c)));
      await child.detach();
    },
  },
  {
    section: "processes.start",
    sentence: "Beachside keeps a small queue of unread output, so read it as it arrives.",
    async run(t) {
      // The queue's bounds, as the SDK states them: 64 KiB and 256 chunks.
      eq(LIMITS.maxQueuedBytes, 64 << 10);
      eq(LIMITS.maxQueuedChunks, 256);
      eq(LIMITS.maxChunkBytes, 16 << 10);
      const child = await t.sandbox.processes.start({ command: sh("seq 1 20000"), output: stream });
      let lines = 0;
      for await (const c of child.output()) lines += c.text.split("\n").length - 1;
      eq(lines, 20000);
      await child.detach();
    },
  },

  // Sending input.
  {
    section: "input",
    sentence: 'Set stdin: "pipe" to call write() and closeStdin().',
    async run(t) {
      const child = await t.sandbox.processes.start({ command: cat, stdin: "pipe", output: stream });
      const out = collect(child);
      await child.write("piped\n");
      await child.closeStdin();
      eq((await out).stdout, "piped\n");
      eq((await child.wait()).exitCode, 0);
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: 'The default, "closed", does not accept input.',
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("read x; echo got:$x"), output: stream });
      await rejects(child.write("x\n"), "STDIN_CLOSED");
      await rejects(child.closeStdin(), "STDIN_CLOSED");
      // The program's stdin is closed: read meets its end at once.
      eq((await collect(child)).stdout, "got:\n");
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "Strings are encoded as UTF-8; Uint8Array values preserve exact bytes, including NUL and invalid UTF-8.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("od -An -tx1 -v"), stdin: "pipe", output: stream });
      const out = collect(child);
      await child.write("é");
      await child.write(new Uint8Array([0x00, 0xff, 0xc3, 0x41]));
      await child.closeStdin();
      deep((await out).stdout.split(/\s+/).filter(Boolean), ["c3", "a9", "00", "ff", "c3", "41"]);
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "Each write can contain at most 64 KiB.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("wc -c"), stdin: "pipe", output: stream });
      const out = collect(child);
      await child.write(new Uint8Array(64 << 10));
      await rejects(child.write(new Uint8Array((64 << 10) + 1)), "INVALID_ARGUMENT");
      await child.closeStdin();
      eq((await out).stdout.trim(), String(64 << 10));
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "The input queue holds at most 256 KiB, including the write in progress, and at most 256 calls.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("wc -c"), stdin: "pipe", output: stream });
      const out = collect(child);
      // 256 calls are taken; the 257th, not awaited for, is refused.
      const calls = [];
      for (let i = 0; i < 256; i++) calls.push(child.write("x"));
      await rejects(child.write("x"), "INPUT_CAPACITY");
      await Promise.all(calls);
      // Four writes of 64 KiB fill the bytes; one byte more is refused.
      const big = [0, 1, 2, 3].map(() => child.write(new Uint8Array(64 << 10)));
      await rejects(child.write("y"), "INPUT_CAPACITY");
      await Promise.all(big);
      await child.closeStdin();
      eq((await out).stdout.trim(), String(256 + (256 << 10)));
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "Beachside copies accepted bytes and sends writes in order.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: cat, stdin: "pipe", output: stream });
      const out = collect(child);
      const buf = encode("abc\n");
      const writes = [child.write(buf), child.write("def\n"), child.write(encode("ghi\n"))];
      buf.set(encode("XYZ")); // changed after the call: the write took a copy
      await Promise.all(writes);
      await child.closeStdin();
      eq((await out).stdout, "abc\ndef\nghi\n");
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "An empty write checks that input is still allowed but does not close stdin.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: cat, stdin: "pipe", output: stream });
      const out = collect(child);
      await child.write("");
      await child.write("still open\n");
      await child.closeStdin();
      await rejects(child.write(""), "STDIN_CLOSED");
      eq((await out).stdout, "still open\n");
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "closeStdin() sends end-of-input (EOF) after earlier writes;",
    async run(t) {
      // 1,000 writes not awaited for, in four groups within the queue's
      // 256 calls, the close called right after the last group's: every
      // line reaches cat, then its end.
      const child = await t.sandbox.processes.start({ command: cat, stdin: "pipe", output: stream });
      const out = collect(child);
      let want = "";
      for (let g = 0; g < 4; g++) {
        const group = [];
        for (let i = 0; i < 250; i++) {
          const line = `line ${g * 250 + i}\n`;
          want += line;
          group.push(child.write(line));
        }
        if (g < 3) await Promise.all(group);
        else await Promise.all([...group, child.closeStdin()]);
      }
      eq((await out).stdout, want);
      eq((await child.wait()).exitCode, 0);
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "repeated successful closes do not send EOF again.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: cat, stdin: "pipe", output: stream });
      await child.closeStdin();
      await child.closeStdin();
      await Promise.all([child.closeStdin(), child.closeStdin()]);
      eq(t.proxy.count("POST", processPath(t, child, "/stdin/close")), 1);
      eq((await child.wait()).exitCode, 0);
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "Later writes reject locally.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: cat, stdin: "pipe", output: stream });
      await child.closeStdin();
      await rejects(child.write("late\n"), "STDIN_CLOSED");
      eq(t.proxy.count("POST", processPath(t, child, "/stdin")), 0, "a write went to kilnd");
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "A successful write means the transport accepted it, not that the program read it.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("sleep 30"), stdin: "pipe", output: stream });
      await child.write("never read\n");
      const r = await record(t, child);
      eq(r.stdin.accepted, "never read\n".length);
      await child.terminate();
      await child.wait();
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "Cancelling a queued write before it is sent has no remote effect.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: cat, stdin: "pipe", output: stream });
      const held = t.proxy.hold("POST", processPath(t, child, "/stdin"));
      const first = child.write("first\n");
      await held.requested;
      const ac = new AbortController();
      const queued = child.write("cancelled\n", { signal: ac.signal });
      ac.abort();
      await rejects(queued, "WAIT_ABORTED");
      held.release();
      await first;
      await child.write("third\n");
      await child.closeStdin();
      eq((await collect(child)).stdout, "first\nthird\n");
      eq(t.proxy.count("POST", processPath(t, child, "/stdin")), 2);
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "If a sent write or EOF is not acknowledged, delivery is unknown and further input is disabled.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: cat, stdin: "pipe", output: stream });
      const cut = t.proxy.cutAnswer("POST", processPath(t, child, "/stdin"));
      await rejects(child.write("lost answer\n"), "OUTCOME_UNKNOWN");
      await cut.answer;
      await rejects(child.write("more\n"), "INPUT_UNCERTAIN");
      await rejects(child.closeStdin(), "INPUT_UNCERTAIN");
      throws(() => child.reference(), "INPUT_UNCERTAIN");
      // kilnd did take it.
      eq((await record(t, child)).stdin.accepted, "lost answer\n".length);
      await child.terminate();
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "Beachside never retries that input.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: cat, stdin: "pipe", output: stream });
      const cut = t.proxy.cutAnswer("POST", processPath(t, child, "/stdin/close"));
      await rejects(child.closeStdin(), "OUTCOME_UNKNOWN");
      await cut.answer;
      await rejects(child.closeStdin(), "INPUT_UNCERTAIN");
      eq(t.proxy.count("POST", processPath(t, child, "/stdin/close")), 1);
      eq((await child.wait()).exitCode, 0); // the EOF did arrive
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "You can still read output, check status, wait or terminate where the connection allows.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: cat, stdin: "pipe", output: stream });
      const cut = t.proxy.cutAnswer("POST", processPath(t, child, "/stdin"));
      await rejects(child.write("echoed\n"), "OUTCOME_UNKNOWN");
      await cut.answer;
      eq(await readUntil(child, "echoed\n"), "echoed\n");
      eq((await child.status()).state, "running");
      deep(await child.terminate(), { status: "requested" });
      eq((await child.wait()).signal, "SIGKILL");
      await child.detach();
    },
  },
  {
    section: "input",
    sentence: "Each dispatched input request, status check and termination request has a 30-second local timeout; that timeout does not limit the process's runtime or the sandbox's lifetime.",
    needs: "slow",
    async run(t) {
      const child = await t.via.processes.start({ command: cat, stdin: "pipe", output: stream });
      const sleeper = await t.via.processes.start({ command: sh("sleep 300"), output: stream });
      const holds = [
        t.proxy.hold("POST", processPath(t, child, "/stdin")),
        t.proxy.hold("GET", processPath(t, sleeper)),
        t.proxy.hold("DELETE", processPath(t, sleeper)),
      ];
      const timed = async (p) => {
        const t0 = Date.now();
        const v = await p.then((value) => ({ value }), (error) => ({ error }));
        return { ...v, ms: Date.now() - t0 };
      };
      const [write, status, terminate] = await Promise.all([timed(child.write("held\n")), timed(sleeper.status()), timed(sleeper.terminate())]);
      for (const [what, r] of Object.entries({ write, status, terminate })) ok(r.ms >= 29_900 && r.ms < 45_000, `${what} gave up after ${r.ms} ms`);
      isError(write.error, "OUTCOME_UNKNOWN");
      eq(status.value.state, "unknown");
      isError(terminate.error, "OUTCOME_UNKNOWN");
      for (const h of holds) await h.answer;
      // The process ran on; the sandbox is there.
      eq((await record(t, child)).state, "running");
      eq((await t.sandbox.refresh()).state, "running");
      await t.sandbox.transport.call("DELETE", t.sandbox.path(`/exec-stream/${child.id}`));
      await child.detach();
      await sleeper.detach();
    },
  },

  // Reading output.
  {
    section: "output",
    sentence: "Each process has one output consumer.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("read x; echo $x"), stdin: "pipe", output: stream });
      const first = collect(child);
      await tick(0);
      await rejects(collect(child), "OUTPUT_IN_USE");
      await child.write("one\n");
      eq((await first).stdout, "one\n");
      await child.detach();
    },
  },
  {
    section: "output",
    sentence: "In stream mode, leaving the output loop stops reading output but leaves input and process control available.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: cat, stdin: "pipe", output: stream });
      await child.write("a\n");
      eq(await readUntil(child, "a\n"), "a\n");
      await child.write("b\n"); // input still available
      eq((await child.status()).state, "running");
      eq(await readUntil(child, "b\n"), "b\n"); // output again, from where it stood
      await child.closeStdin();
      eq((await child.wait()).exitCode, 0);
      await child.detach();
    },
  },
  {
    section: "output",
    sentence: "In the default finite mode, leaving the loop detaches the whole local handle.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("echo one; sleep 30"), stdin: "pipe" });
      eq(await readUntil(child, "one\n"), "one\n");
      await rejects(child.write("x"), "DETACHED");
      await rejects(child.status(), "DETACHED");
      await rejects(child.wait(), "DETACHED");
      eq((await record(t, child)).state, "running", "leaving the loop killed the process");
      await t.sandbox.transport.call("DELETE", t.sandbox.path(`/exec-stream/${child.id}`));
    },
  },
  {
    section: "output",
    sentence: "The unread SDK queue holds at most 64 KiB and 256 chunks.",
    needs: "proxy",
    async run(t) {
      // A consumer that stops after its first chunk: kilnd sends no more
      // than the queue holds (its credit), so the bytes that crossed the
      // proxy stay within a queue's worth, however much the process wrote.
      const total = 8 << 20;
      const child = await t.via.processes.start({ command: sh(`head -c ${total} /dev/zero`), output: { mode: "stream", format: "bytes" } });
      const it = child.output();
      const first = await it.next();
      ok(!first.done && first.value.bytes.length <= LIMITS.maxChunkBytes);
      await until(t, child, (r) => r.held, "the process waiting for its reader");
      // What crossed: the chunk delivered, a queue's worth unread, a frame
      // held apart until the queue has room (the seed's bounded incoming
      // frame), and the messages' headers.
      const crossed = t.proxy.bytesFrom(processPath(t, child, "/logs"));
      ok(crossed <= first.value.bytes.length + LIMITS.maxQueuedBytes + LIMITS.maxReadAheadBytes + 4096, `${crossed} bytes crossed while the consumer read one chunk`);
      let got = first.value.bytes.length;
      for (;;) {
        const { value, done } = await it.next();
        if (done) break;
        ok(value.bytes.length <= LIMITS.maxChunkBytes);
        got += value.bytes.length;
      }
      eq(got, total);
      await child.detach();
    },
  },
  {
    section: "output",
    sentence: "Each delivered chunk is at most 16 KiB.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("head -c 3000000 /dev/zero | tr '\\0' x"), output: stream });
      let n = 0;
      for await (const c of child.output()) {
        ok(encode(c.text).length <= LIMITS.maxChunkBytes, `a chunk of ${encode(c.text).length} bytes`);
        n += c.text.length;
      }
      eq(n, 3000000);
      await child.detach();
    },
  },
  {
    section: "output",
    sentence: "Stream mode has no total output limit over the process's lifetime.",
    async run(t) {
      // 32 MiB written as fast as the program can, read by a loop that
      // does nothing else: every byte, by SHA-256.
      const r = await burst(t, 32 << 20);
      eq(r.error, undefined);
      eq(r.got.length, 32 << 20);
      eq(r.sum, r.want, "SHA-256 of what came");
      eq(r.result.outputComplete, true);
    },
  },
  {
    section: "output",
    sentence: "If your consumer falls behind and fills the queue, output fails with OUTPUT_CAPACITY.",
    deviation: "A process its handle started waits for the handle's reader instead (as a program waits for its terminal), so a consumer that falls behind loses nothing; OUTPUT_CAPACITY is for bytes really lost, as below.",
    async run(t) {
      // A reader paused for 5 s during a 64 MiB burst: every byte, or
      // OUTPUT_CAPACITY; never a short transcript without an error.
      let paused = false;
      const r = await burst(t, 64 << 20, async (_, at) => {
        if (!paused && at >= 1 << 20) {
          paused = true;
          await tick(5000);
        }
      });
      if (r.error) {
        isError(r.error, "OUTPUT_CAPACITY");
      } else {
        eq(r.got.length, 64 << 20);
        eq(r.sum, r.want, "SHA-256 of what came");
      }
      ok(paused);
    },
  },
  {
    section: "output",
    sentence: "Beachside stops local output observation without silently dropping chunks or killing the process.",
    async run(t) {
      // A process that does not wait for its reader (flow "drop") and a
      // reader that stalls until 4 MiB (four times what kilnd keeps) were
      // written: what came is contiguous from 0, then OUTPUT_CAPACITY with
      // the count, and the process runs on.
      const total = 4 << 20;
      const child = await t.sandbox.processes.start({
        command: sh(`head -c ${total} /dev/zero; read x; echo got-$x`), stdin: "pipe", output: { mode: "stream", format: "bytes", flow: "drop" },
      });
      const it = child.output();
      let got = 0;
      let err;
      try {
        const first = await it.next();
        got = first.value.bytes.length;
        await until(t, child, (r) => r.streams.stdout.total_bytes === total, "all of the output written");
        for (;;) {
          const { value, done } = await it.next();
          if (done) break;
          eq(value.offset, got, "a chunk skipped");
          got += value.bytes.length;
        }
      } catch (e) {
        err = e;
      }
      const e = isError(err, "OUTPUT_CAPACITY");
      ok(/\d+ bytes of stdout were lost/.test(e.message), e.message);
      ok(got < total);
      eq((await record(t, child)).state, "running");
      await child.write("on\n");
      const w = await child.wait();
      eq(w.exitCode, 0);
      eq(w.outputComplete, false);
      ok(w.streams.stdout.lostBytes > 0);
      await child.detach();
    },
  },
  {
    section: "output",
    sentence: "A native transport can allocate one bounded incoming frame before the SDK checks its queue.",
    needs: "proxy",
    async run(t) {
      // The bound is the credit: kilnd sends no frame past it, so the
      // queue is never over, whatever the runtime's WebSocket.
      const child = await t.via.processes.start({ command: sh("head -c 2000000 /dev/zero"), output: { mode: "stream", format: "bytes" } });
      const it = child.output();
      const first = await it.next();
      await until(t, child, (r) => r.held, "the process waiting for its reader");
      ok(t.proxy.bytesFrom(processPath(t, child, "/logs")) <= first.value.bytes.length + LIMITS.maxQueuedBytes + LIMITS.maxReadAheadBytes + 4096);
      await it.return();
      await child.detach();
    },
  },

  // Byte output.
  {
    section: "bytes",
    sentence: 'Set output: { mode: "stream", format: "bytes" } when starting the process. child.output() then yields { stream, bytes: Uint8Array } from the native pipe, preserving NUL and invalid UTF-8.',
    async run(t) {
      // 256 KiB of every byte value on stdout; invalid UTF-8 and NUL on stderr.
      const child = await t.sandbox.processes.start({
        command: sh("d=$(mktemp -d); printf \"$(printf '\\\\%03o' $(seq 0 255) | tr -d ' ')\" > $d/p; for i in 1 2 3 4 5 6 7 8 9 10; do cat $d/p $d/p > $d/q; mv $d/q $d/p; done; cat $d/p; rm -r $d; printf '\\000\\377\\300' >&2"),
        output: { mode: "stream", format: "bytes" },
      });
      const parts = { stdout: [], stderr: [] };
      for await (const c of child.output()) {
        ok(c.bytes instanceof Uint8Array);
        parts[c.stream].push(c.bytes);
      }
      const out = concat(parts.stdout);
      eq(out.length, 256 * 1024);
      for (let i = 0; i < out.length; i++) if (out[i] !== i % 256) throw new Error(`byte ${i} is ${out[i]}`);
      deep(concat(parts.stderr), new Uint8Array([0, 0xff, 0xc0]));
      await child.detach();
    },
  },
  {
    section: "bytes",
    sentence: "Each chunk owns its bytes.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("head -c 100000 /dev/zero | tr '\\0' a"), output: { mode: "stream", format: "bytes" } });
      const kept = [];
      for await (const c of child.output()) {
        kept.push(c.bytes);
        c.bytes.fill(0x7a); // the consumer's to change
      }
      ok(kept.every((b) => b.every((x) => x === 0x7a)));
      eq(kept.reduce((n, b) => n + b.length, 0), 100000);
      await child.detach();
    },
  },
  {
    section: "bytes",
    sentence: "A chunk can end in the middle of a character or application record; process chunks incrementally or use a streaming decoder.",
    async run(t) {
      // Text mode decodes across chunk boundaries: 20,000 € (3 bytes each)
      // come back whole whatever the cuts.
      const child = await t.sandbox.processes.start({ command: sh("i=0; while [ $i -lt 20 ]; do head -c 1000 /dev/zero | sed 's/\\x00/€/g'; i=$((i+1)); done"), output: stream });
      const out = await collect(child);
      eq(out.stdout, "€".repeat(20000));
      await child.detach();
    },
  },
  {
    section: "bytes",
    sentence: "Each byte chunk is at most 16 KiB, with at most 64 KiB unread.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("head -c 1000000 /dev/urandom"), output: { mode: "stream", format: "bytes" } });
      let n = 0;
      for await (const c of child.output()) {
        ok(c.bytes.length <= 16 << 10);
        n += c.bytes.length;
      }
      eq(n, 1000000);
      await child.detach();
    },
  },

  // Waiting for exit.
  {
    section: "waiting",
    sentence: "wait({ signal }) waits for a confirmed exit and returns an exit code, including nonzero codes.",
    async run(t) {
      for (const code of [0, 1, 42, 255]) {
        const child = await t.sandbox.processes.start({ command: sh(`exit ${code}`), output: stream });
        const r = await child.wait({ signal: AbortSignal.timeout(30_000) });
        eq(r.exitCode, code);
        eq(r.signal, null);
        await child.detach();
      }
      // A signal's exit has a code too: 128 plus its number, beside its name.
      const killed = await t.sandbox.processes.start({ command: sh("kill -KILL $$"), output: stream });
      const r = await killed.wait();
      deep([r.exitCode, r.signal], [137, "SIGKILL"]);
      await killed.detach();
    },
  },
  {
    section: "waiting",
    sentence: "It has no default timeout; supply an abort signal to limit your wait.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("sleep 30"), output: stream });
      await rejects(child.wait({ signal: AbortSignal.timeout(200) }), "WAIT_ABORTED");
      eq((await child.status()).state, "running");
      await child.terminate();
      eq((await child.wait()).signal, "SIGKILL");
      await child.detach();
    },
  },
  {
    section: "waiting",
    sentence: "Aborting cancels only that waiter.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("read x; exit 3"), stdin: "pipe", output: stream });
      const ac = new AbortController();
      const aborted = child.wait({ signal: ac.signal });
      const other = child.wait();
      ac.abort();
      await rejects(aborted, "WAIT_ABORTED");
      await child.write("\n");
      eq((await other).exitCode, 3);
      await child.detach();
    },
  },
  {
    section: "waiting",
    sentence: "The result's outputComplete is true only after the output stream has ended and all queued output has been delivered without a gap.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("echo a; echo b >&2"), output: stream });
      const out = await collect(child);
      eq(out.stdout + out.stderr, "a\nb\n");
      const r = await child.wait();
      eq(r.outputComplete, true);
      deep(r.streams.stdout, { bytes: 2, lostBytes: 0, ended: true });
      await child.detach();
    },
  },
  {
    section: "waiting",
    sentence: "A wait that finishes before output drains can return false; a later wait can return true.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("echo done"), output: stream });
      const early = await child.wait(); // nothing read yet
      eq(early.outputComplete, false);
      await collect(child);
      eq((await child.wait()).outputComplete, true);
      await child.detach();
    },
  },
  {
    section: "waiting",
    sentence: "Earlier results do not change.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("echo x; exit 4"), output: stream });
      const early = await child.wait();
      const copy = JSON.parse(JSON.stringify(early));
      await collect(child);
      const later = await child.wait();
      eq(later.outputComplete, true);
      deep(JSON.parse(JSON.stringify(early)), copy);
      await child.detach();
    },
  },
  {
    section: "waiting",
    sentence: "An output error does not erase a confirmed exit.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("head -c 4194304 /dev/zero; exit 5"), output: { mode: "stream", format: "bytes", flow: "drop" } });
      const exit = await child.wait();
      eq(exit.exitCode, 5);
      await rejects((async () => {
        for await (const _ of child.output());
      })(), "OUTPUT_CAPACITY");
      const after = await child.wait();
      deep([after.exitCode, after.signal, after.outputComplete], [5, null, false]);
      eq((await child.status()).exit.exitCode, 5);
      await child.detach();
    },
  },
  {
    section: "waiting",
    sentence: "If a broken connection also prevents exit observation, the wait fails as unavailable instead of guessing an exit code.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: sh("sleep 30"), output: stream });
      // Every attempt cut: a runtime that sends an idempotent request
      // again by itself (Bun's fetch) meets the cut again.
      const cut = t.proxy.cutRequest("GET", processPath(t, child, "/wait"), Infinity);
      await rejects(child.wait(), "UNAVAILABLE");
      cut.remove();
      eq((await child.status()).state, "running");
      await child.terminate();
      eq((await child.wait()).signal, "SIGKILL");
      await child.detach();
    },
  },

  // Checking status.
  {
    section: "status",
    sentence: 'status({ signal }) returns { state: "running" | "exited" | "unknown", exit?, observedAt } without downloading a transcript.',
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: sh("head -c 1000000 /dev/zero; read x"), stdin: "pipe", output: stream });
      const st = await child.status({ signal: AbortSignal.timeout(10_000) });
      eq(st.state, "running");
      eq(st.exit, undefined);
      ok(st.observedAt instanceof Date);
      eq(t.proxy.count("GET", processPath(t, child, "/logs")), 0, "status downloaded output");
      await child.write("\n");
      await child.wait();
      const done = await child.status();
      eq(done.state, "exited");
      eq(done.exit.exitCode, 0);
      await child.detach();
    },
  },
  {
    section: "status",
    sentence: "Unknown means there is not enough evidence to say whether the process is running. Having a local handle alone does not prove it is running.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: sh("sleep 30"), output: stream });
      const cut = t.proxy.cutRequest("GET", processPath(t, child), Infinity);
      const st = await child.status();
      cut.remove();
      eq(st.state, "unknown");
      eq(st.error.code, "UNAVAILABLE");
      eq(st.exit, undefined);
      await child.terminate();
      await child.wait();
      await child.detach();
    },
  },
  {
    section: "status",
    sentence: "A confirmed exit is preserved.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: sh("exit 6"), output: stream });
      await child.wait();
      const cut = t.proxy.cutRequest("GET", processPath(t, child), Infinity);
      const st = await child.status();
      cut.remove();
      eq(st.state, "exited");
      eq(st.exit.exitCode, 6);
      await child.detach();
    },
  },

  // Stopping and cleaning up.
  {
    section: "termination",
    sentence: 'terminate({ signal }) returns { status: "requested" | "not-found" | "exited" }.',
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("sleep 30"), output: stream });
      deep(await child.terminate({ signal: AbortSignal.timeout(10_000) }), { status: "requested" });
      await child.wait();
      deep(await child.terminate(), { status: "exited" });
      await child.detach();
      // A process kilnd no longer has (a tombstone evicted, or never there).
      const ghost = await t.sandbox.processes.get(child.id);
      await t.sandbox.transport.call("DELETE", t.sandbox.path(`/exec-stream/${child.id}`)).catch(() => undefined);
      ok(["exited", "not-found"].includes((await ghost.terminate()).status));
      await ghost.detach();
    },
  },
  {
    section: "termination",
    sentence: "A successful request does not prove the process has exited: call wait() separately.",
    async run(t) {
      // A process that lingers after the kill's delivery: its exit comes from wait().
      const child = await t.sandbox.processes.start({ command: sh("sleep 30"), output: stream });
      const r = await child.terminate();
      eq(r.status, "requested");
      const w = await child.wait();
      eq(w.signal, "SIGKILL");
      await child.detach();
    },
  },
  {
    section: "termination",
    sentence: "Concurrent callers share one termination request, and cancelling one caller stops only its wait.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: sh("sleep 30"), output: stream });
      const held = t.proxy.hold("DELETE", processPath(t, child));
      const ac = new AbortController();
      const a = child.terminate({ signal: ac.signal });
      await held.requested;
      const b = child.terminate();
      ac.abort();
      await rejects(a, "WAIT_ABORTED");
      held.release();
      deep(await b, { status: "requested" });
      eq(t.proxy.count("DELETE", processPath(t, child)), 1);
      await child.wait();
      await child.detach();
    },
  },
  {
    section: "termination",
    sentence: "If the request's acknowledgement is lost, later calls return the saved OUTCOME_UNKNOWN failure without sending another request.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: sh("sleep 30"), output: stream });
      const cut = t.proxy.cutAnswer("DELETE", processPath(t, child));
      const first = await rejects(child.terminate(), "OUTCOME_UNKNOWN");
      await cut.answer;
      const again = await rejects(child.terminate(), "OUTCOME_UNKNOWN");
      eq(again, first);
      eq(t.proxy.count("DELETE", processPath(t, child)), 1);
      eq((await child.wait()).signal, "SIGKILL"); // it did take effect
      await child.detach();
    },
  },
  {
    section: "termination",
    sentence: "Termination targets the launched process; provider limitations apply to child processes and cleanup.",
    async run(t) {
      // kilnd kills the launched process's group: its children too.
      const child = await t.sandbox.processes.start({ command: sh("sleep 300 & echo $!; wait"), output: stream });
      const pid = (await readUntil(child, "\n")).trim();
      await child.terminate();
      await child.wait();
      // Gone, or a zombie its reaper has not yet collected.
      const check = await t.sandbox.exec({ command: sh(`s=$(cut -d' ' -f3 /proc/${pid}/stat 2>/dev/null); [ -z "$s" ] || [ "$s" = Z ] && echo gone || echo alive`) });
      eq(check.stdout, "gone\n");
      await child.detach();
    },
  },
  {
    section: "termination",
    sentence: "Beachside does not escalate automatically or destroy the sandbox as a fallback.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: sh("trap '' TERM; echo ready; while :; do sleep 1; done"), output: stream });
      await readUntil(child, "ready");
      await child.signal("SIGTERM");
      await rejects(child.wait({ signal: AbortSignal.timeout(1500) }), "WAIT_ABORTED");
      eq((await child.status()).state, "running");
      eq(t.proxy.count("DELETE", processPath(t, child)), 0, "a kill was sent");
      eq((await t.sandbox.refresh()).state, "running");
      await child.terminate();
      await child.wait();
      await child.detach();
    },
  },
  {
    section: "termination",
    sentence: "detach() releases local input and output connections and discards unread output. Calling it again is safe.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("head -c 500000 /dev/zero; sleep 30"), stdin: "pipe", output: { mode: "stream", format: "bytes" } });
      const it = child.output();
      await it.next();
      await child.detach();
      await rejects(it.next(), "DETACHED");
      await child.detach();
      await rejects(child.write("x"), "DETACHED");
      await rejects(child.terminate(), "DETACHED");
      await t.sandbox.transport.call("DELETE", t.sandbox.path(`/exec-stream/${child.id}`));
    },
  },
  {
    section: "termination",
    sentence: "It does not request a kill, resume compute or extend sandbox lifetime.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: sh("sleep 30"), stdin: "pipe", output: stream });
      await child.detach();
      eq(t.proxy.count("DELETE", processPath(t, child)), 0);
      eq(t.proxy.count("POST", processPath(t, child, "/signal")), 0);
      eq(t.proxy.count("POST", processPath(t, child, "/stdin/close")), 0);
      const r = await record(t, child);
      eq(r.state, "running");
      eq(r.stdin.closed, false);
      await t.sandbox.transport.call("DELETE", t.sandbox.path(`/exec-stream/${child.id}`));
    },
  },
  {
    section: "termination",
    sentence: "Lifecycle operations submitted through the same client prevent old process handles from sending new control requests;",
    async run(t) {
      const sb = await t.client.sandboxes.create();
      const child = await sb.processes.start({ command: sh("sleep 30"), stdin: "pipe", output: stream });
      const waiting = rejects(child.wait(), "DETACHED"); // a pending call settles
      await sb.destroy();
      await waiting;
      await rejects(child.write("x"), "DETACHED");
      await rejects(child.terminate(), "DETACHED");
      await rejects(child.status(), "DETACHED");
    },
  },
  {
    section: "termination",
    sentence: "Every pending call settles when its handle or client goes away.",
    async run(t) {
      const { Client } = await import("../../dist/index.js");
      const other = new Client({ url: t.kilnd.url, token: t.kilnd.token });
      const sb = await other.sandboxes.get(t.sandbox.id);
      const child = await sb.processes.start({ command: sh("sleep 30"), output: stream });
      const w1 = rejects(child.wait(), "DETACHED");
      await child.detach();
      await w1;
      const again = await sb.processes.start({ command: sh("sleep 30"), output: stream });
      const w2 = rejects(again.wait(), "DETACHED");
      await other.close();
      await w2;
      // Finite mode's loop, left early, detaches: a pending wait settles.
      const finite = await t.sandbox.processes.start({ command: sh("echo x; sleep 30") });
      const w3 = rejects(finite.wait(), "DETACHED");
      await readUntil(finite, "x");
      await w3;
      for (const h of [child, again, finite]) await t.sandbox.transport.call("DELETE", t.sandbox.path(`/exec-stream/${h.id}`));
    },
  },
  {
    section: "termination",
    sentence: "An already-aborted signal does nothing but reject.",
    needs: "proxy",
    async run(t) {
      const ac = new AbortController();
      ac.abort();
      const child = await t.via.processes.start({ command: cat, stdin: "pipe", output: stream });
      await rejects(child.terminate({ signal: ac.signal }), "WAIT_ABORTED");
      await rejects(child.signal("SIGTERM", { signal: ac.signal }), "WAIT_ABORTED");
      await rejects(child.write("x", { signal: ac.signal }), "WAIT_ABORTED");
      await rejects(child.closeStdin({ signal: ac.signal }), "WAIT_ABORTED");
      eq(t.proxy.count("DELETE", processPath(t, child)), 0);
      eq(t.proxy.count("POST", processPath(t, child, "/signal")), 0);
      eq((await record(t, child)).state, "running");
      const sb = await t.client.sandboxes.create();
      const held = await sb.processes.start({ command: sh("sleep 30"), output: stream });
      await rejects(sb.destroy({ signal: ac.signal }), "WAIT_ABORTED");
      eq((await held.status()).state, "running", "the aborted destroy let the handle go");
      await sb.destroy();
      await child.terminate();
      await child.detach();
    },
  },
  {
    section: "termination",
    sentence: "Options the SDK does not know, or in the wrong place, are refused.",
    async run(t) {
      await rejects(t.sandbox.processes.start({ command: sh("true"), maxOutputBytes: 10 }), "INVALID_ARGUMENT");
      await rejects(t.sandbox.processes.start({ command: sh("true") }, { signal: AbortSignal.timeout(1000) }), "INVALID_ARGUMENT");
      await rejects(t.sandbox.processes.start({ command: sh("true"), output: { mode: "stream", buffer: 1 } }), "INVALID_ARGUMENT");
      const child = await t.sandbox.processes.start({ command: sh("sleep 30"), output: stream });
      await rejects(child.wait({ timeout: 5 }), "INVALID_ARGUMENT");
      await rejects(child.terminate({}, { signal: AbortSignal.timeout(1000) }), "INVALID_ARGUMENT");
      await rejects((async () => {
        for await (const _ of child.output({ signal: AbortSignal.timeout(1000), follow: false }));
      })(), "INVALID_ARGUMENT");
      throws(() => createProcessTail({ maxLine: 3 }), "INVALID_ARGUMENT");
      eq((await child.status()).state, "running");
      await child.terminate();
      await child.detach();
    },
  },

  // Signals and explicit terminals.
  {
    section: "signals",
    sentence: 'await child.signal("SIGTERM") asks the process to shut down gracefully.',
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 1; done"), output: stream });
      await readUntil(child, "ready");
      await child.signal("SIGTERM");
      ok((await readUntil(child, "bye")).endsWith("bye\n"));
      eq((await child.wait()).exitCode, 0);
      await child.detach();
    },
  },
  {
    section: "signals",
    sentence: "A process can ignore SIGTERM, so call child.wait() to confirm exit.",
    async run(t) {
      // It runs on until told otherwise, not for a time the signal must beat.
      const child = await t.sandbox.processes.start({ command: sh("trap '' TERM; echo ready; read x; exit 9"), stdin: "pipe", output: stream });
      await readUntil(child, "ready");
      await child.signal("SIGTERM");
      await child.write("go\n");
      eq((await child.wait()).exitCode, 9);
      await child.detach();
    },
  },
  {
    section: "signals",
    sentence: '"SIGKILL" requests a forced stop; terminate() is the convenience method for that signal.',
    async run(t) {
      const a = await t.sandbox.processes.start({ command: sh("trap '' TERM; sleep 30"), output: stream });
      await a.signal("SIGKILL");
      deep([(await a.wait()).signal, (await a.wait()).exitCode], ["SIGKILL", 137]);
      const b = await t.sandbox.processes.start({ command: sh("sleep 30"), output: stream });
      await b.terminate();
      eq((await b.wait()).signal, "SIGKILL");
      await a.detach();
      await b.detach();
    },
  },
  {
    section: "signals",
    sentence: "Beachside does not automatically escalate from SIGTERM to SIGKILL or destroy the sandbox.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("trap '' TERM; echo ready; while :; do sleep 1; done"), output: stream });
      await readUntil(child, "ready");
      await child.signal("SIGTERM");
      await rejects(child.wait({ signal: AbortSignal.timeout(1500) }), "WAIT_ABORTED");
      eq((await record(t, child)).state, "running");
      await child.terminate();
      await child.wait();
      await child.detach();
    },
  },

  // Terminals.
  {
    section: "terminal",
    sentence: "Use sandbox.terminals.start({ command, columns: 80, rows: 24 }) for programs that need a terminal.",
    async run(t) {
      const term = await t.sandbox.terminals.start({ command: sh("stty size; [ -t 0 ] && echo tty"), columns: 80, rows: 24 });
      let seen = "";
      for await (const b of term.output()) seen += decode(b);
      ok(/24 80/.test(seen) && /tty/.test(seen), JSON.stringify(seen));
      await term.detach();
    },
  },
  {
    section: "terminal",
    sentence: "Its one output() iterator yields combined stdout/stderr as Uint8Array chunks.",
    async run(t) {
      const term = await t.sandbox.terminals.start({ command: sh("echo out; echo err >&2") });
      let seen = "";
      for await (const b of term.output()) {
        ok(b instanceof Uint8Array, `a chunk of ${Object.prototype.toString.call(b)}`);
        seen += decode(b);
      }
      ok(seen.includes("out") && seen.includes("err"), JSON.stringify(seen));
      await term.detach();
    },
  },
  {
    section: "terminal",
    sentence: "You can write input, resize with resize({ columns: 120, rows: 40 }), check status, wait, send signals and terminate.",
    async run(t) {
      const term = await t.sandbox.terminals.start({ command: { kind: "argv", argv: ["sh"] } });
      const reading = (async () => {
        let s = "";
        for await (const b of term.output()) s += decode(b);
        return s;
      })();
      await term.resize({ columns: 120, rows: 40 });
      eq((await term.status()).state, "running");
      await term.write("stty size\n");
      await term.signal("SIGWINCH");
      await term.write("exit 3\n");
      ok(/40 120/.test(await reading));
      eq((await term.wait()).exitCode, 3);
      const other = await t.sandbox.terminals.start({ command: sh("sleep 30") });
      await other.terminate();
      eq((await other.wait()).signal, "SIGKILL");
      await term.detach();
      await other.detach();
    },
  },
  {
    section: "terminal",
    sentence: "A terminal has no closeStdin().",
    async run(t) {
      const term = await t.sandbox.terminals.start({ command: sh("true") });
      eq(typeof term.closeStdin, "undefined");
      await term.wait();
      await term.detach();
    },
  },
  {
    section: "terminal",
    sentence: "Sending Ctrl+D is terminal input, not a pipe close.",
    async run(t) {
      const term = await t.sandbox.terminals.start({ command: sh("cat; echo after-eof") });
      const reading = (async () => {
        let s = "";
        for await (const b of term.output()) s += decode(b);
        return s;
      })();
      await term.write("typed\n");
      await term.write("\x04"); // the terminal's end-of-file character: cat's read returns 0
      const seen = await reading;
      ok(seen.includes("typed") && seen.includes("after-eof"), JSON.stringify(seen));
      eq((await term.wait()).exitCode, 0);
      await term.detach();
    },
  },
  {
    section: "terminal",
    sentence: "Terminals can echo input, translate newlines and change how programs buffer output.",
    async run(t) {
      const term = await t.sandbox.terminals.start({ command: sh("read x; echo got:$x") });
      const reading = (async () => {
        let s = "";
        for await (const b of term.output()) s += decode(b);
        return s;
      })();
      await term.write("hi\n");
      const seen = await reading;
      ok(seen.includes("hi\r\n"), `no echo of the input: ${JSON.stringify(seen)}`);
      ok(seen.includes("got:hi\r\n"), `newlines not translated: ${JSON.stringify(seen)}`);
      await term.detach();
    },
  },

  // Reopening.
  {
    section: "reopen",
    sentence: "Save sandbox.reference and child.reference() as private JSON. The process reference records its current input/output settings.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: cat, stdin: "pipe", output: { mode: "stream", format: "bytes", overflow: "report" } });
      const ref = JSON.parse(JSON.stringify(child.reference()));
      const sref = JSON.parse(JSON.stringify(t.sandbox.reference));
      deep([ref.format, ref.mode, ref.overflow, ref.stdin.pipe], ["bytes", "stream", "report", true]);
      eq(sref.id, t.sandbox.id);
      await child.disconnect();
      const sb = await t.client.sandboxes.get(sref);
      const again = await sb.processes.reopen(ref);
      await again.write("x");
      await again.closeStdin();
      for await (const c of again.output()) ok(c.bytes instanceof Uint8Array);
      await again.detach();
    },
  },
  {
    section: "reopen",
    sentence: "Creating one rejects while EOF acknowledgement is pending or input delivery is uncertain.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: cat, stdin: "pipe", output: stream });
      const held = t.proxy.hold("POST", processPath(t, child, "/stdin/close"));
      const closing = child.closeStdin();
      await held.requested;
      throws(() => child.reference(), "FAILED_PRECONDITION");
      held.release();
      await closing;
      ok(child.reference());
      await child.detach();
    },
  },
  {
    section: "reopen",
    sentence: "Call await child.disconnect() to release observation without closing the child's stdin. The old handle then rejects further input and control requests.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: cat, stdin: "pipe", output: stream });
      await child.write("before\n");
      const ref = child.reference();
      await child.disconnect();
      await rejects(child.write("x"), "DETACHED");
      await rejects(child.terminate(), "DETACHED");
      await rejects(child.signal("SIGTERM"), "DETACHED");
      eq((await record(t, child)).stdin.closed, false);
      const again = await t.sandbox.processes.reopen(ref);
      await again.write("after\n");
      await again.closeStdin();
      eq((await collect(again)).stdout, "before\nafter\n");
      await again.detach();
    },
  },
  {
    section: "reopen",
    sentence: "For a terminal, use sandbox.terminals.reopen(savedTerminal).",
    async run(t) {
      const term = await t.sandbox.terminals.start({ command: { kind: "argv", argv: ["sh"] } });
      await term.write("echo one\n");
      const ref = term.reference();
      eq(ref.kind, "terminal");
      await term.disconnect();
      await rejects(t.sandbox.processes.reopen(ref), "INVALID_ARGUMENT");
      const again = await t.sandbox.terminals.reopen(ref);
      await again.write("exit 0\n");
      let seen = "";
      for await (const b of again.output()) seen += decode(b);
      ok(seen.includes("one"));
      await again.detach();
    },
  },
  {
    section: "reopen",
    sentence: "References check the provider, sandbox, connection scope and process settings.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: cat, stdin: "pipe", output: stream });
      const ref = child.reference();
      const sb = await t.client.sandboxes.create();
      await rejects(sb.processes.reopen(ref), "INVALID_ARGUMENT");
      await rejects(t.sandbox.processes.reopen({ ...ref, format: "utf16" }), "INVALID_ARGUMENT");
      await rejects(t.sandbox.processes.reopen({ ...ref, stdin: { ...ref.stdin, pipe: false } }), "INVALID_ARGUMENT");
      await rejects(t.sandbox.processes.reopen({ ...ref, offsets: { stdout: 99 } }), "OUT_OF_RANGE");
      await sb.destroy();
      await child.terminate();
      await child.detach();
    },
  },
  {
    section: "reopen",
    sentence: "They expire after at most 24 hours and can become unavailable sooner.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("sleep 30"), output: stream });
      const ref = child.reference();
      ok(Date.parse(ref.expiresAt) <= Date.now() + 24 * 3600 * 1000 + 1000);
      await rejects(t.sandbox.processes.reopen({ ...ref, expiresAt: new Date(Date.now() - 1).toISOString() }), "FAILED_PRECONDITION");
      await rejects(t.sandbox.processes.reopen({ ...ref, expiresAt: new Date(Date.now() + 48 * 3600 * 1000).toISOString() }), "INVALID_ARGUMENT");
      await child.terminate();
      await child.detach();
    },
  },
  {
    section: "reopen",
    sentence: "Reopening never starts a replacement process.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: sh("exit 0"), output: stream });
      await child.wait();
      const ref = child.reference();
      await child.disconnect();
      const before = t.proxy.count("POST", new RegExp(`^/sandboxes/${t.sandbox.id}/exec-stream$`));
      const again = await t.via.processes.reopen(ref);
      eq((await again.wait()).exitCode, 0);
      eq(t.proxy.count("POST", new RegExp(`^/sandboxes/${t.sandbox.id}/exec-stream$`)), before);
      await again.detach();
    },
  },
  {
    section: "reopen",
    sentence: "A reopened handle has outputGap: true, and its exit results always have outputComplete: false.",
    deviation: "A reopened handle resumes from the offsets its reference saved: outputGap is false and outputComplete true when nothing was lost; a gap is reported, exactly, only for bytes kilnd no longer had.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("echo one; read x; echo two"), stdin: "pipe", output: stream });
      eq(await readUntil(child, "one\n"), "one\n");
      const ref = child.reference();
      await child.disconnect();
      const again = await t.sandbox.processes.reopen(ref);
      await again.write("\n");
      eq((await collect(again)).stdout, "two\n");
      eq(again.outputGap, false);
      eq((await again.wait()).outputComplete, true);
      await again.detach();
    },
  },
  {
    section: "reopen",
    sentence: "It reads the newly attached live stream, with no historical replay. Output during the connection gap can be lost.",
    deviation: "Output during the connection gap is kept for the handle that started the process (held for kilnd's grace period) and replayed from the saved offsets, nothing repeated.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("read x; seq 1 50000"), stdin: "pipe", output: stream });
      const ref = child.reference();
      await child.disconnect();
      const again = await t.sandbox.processes.reopen(ref);
      await again.write("\n");
      await again.wait(); // everything written while no one read
      const out = await collect(again);
      eq(out.lost, 0);
      eq(out.stdout.split("\n").length - 1, 50000);
      await again.detach();
    },
  },

  // Finite mode.
  {
    section: "finite",
    sentence: "Without it, output uses the default finite mode: at most 1 MiB of cumulative UTF-8 output.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("head -c 1048578 /dev/zero | tr '\\0' a") });
      let n = 0;
      const err = await rejects((async () => {
        for await (const c of child.output()) n += c.text.length;
      })(), "OUTPUT_CAPACITY");
      ok(/1048576/.test(err.message));
      eq(n, 1 << 20);
    },
  },
  {
    section: "finite",
    sentence: "Set maxOutputBytes to a value from 1 through 1,048,576 to lower that limit.",
    async run(t) {
      for (const bad of [0, 1_048_577, 1.5, -1, "10"]) {
        await rejects(t.sandbox.processes.start({ command: sh("true"), output: { maxOutputBytes: bad } }), "INVALID_ARGUMENT", `maxOutputBytes ${bad}`);
      }
      const one = await t.sandbox.processes.start({ command: sh("printf ab"), output: { maxOutputBytes: 1 } });
      let got = "";
      await rejects((async () => {
        for await (const c of one.output()) got += c.text;
      })(), "OUTPUT_CAPACITY");
      eq(got, "a");
      const top = await t.sandbox.processes.start({ command: sh("printf ab"), output: { maxOutputBytes: 1_048_576 } });
      eq((await collect(top)).stdout, "ab");
    },
  },
  {
    section: "finite",
    sentence: "You cannot combine maxOutputBytes with stream mode.",
    async run(t) {
      await rejects(t.sandbox.processes.start({ command: sh("true"), output: { mode: "stream", maxOutputBytes: 10 } }), "INVALID_ARGUMENT");
    },
  },
  {
    section: "finite",
    sentence: "A finite reader that falls behind loses nothing of what it may keep.",
    async run(t) {
      // 1 MiB + 2 bytes, read after all of it was written: the first
      // 1 MiB exactly, then OUTPUT_CAPACITY (never the first 2 bytes lost
      // without a word).
      const total = (1 << 20) + 2;
      const child = await t.sandbox.processes.start({ command: sh("printf AB; head -c 1048576 /dev/zero | tr '\\0' c"), output: { format: "bytes" } });
      // Not read until all of it was written, or the process waits for its reader.
      await until(t, child, (r) => r.held || r.streams.stdout.total_bytes === total, "the output written");
      let got = "";
      const err = await rejects((async () => {
        for await (const c of child.output()) got += decode(c.bytes);
      })(), "OUTPUT_CAPACITY");
      ok(err);
      eq(got.length, 1 << 20);
      eq(got.slice(0, 3), "ABc");
    },
  },
  {
    section: "finite",
    sentence: "An abort before dispatch reports WAIT_ABORTED.",
    needs: "proxy",
    async run(t) {
      const ac = new AbortController();
      ac.abort();
      const start = new RegExp(`^/sandboxes/${t.sandbox.id}/exec-stream$`);
      const before = t.proxy.count("POST", start);
      await rejects(t.via.processes.start({ command: sh("true"), signal: ac.signal }), "WAIT_ABORTED");
      eq(t.proxy.count("POST", start), before);
    },
  },
  {
    section: "finite",
    sentence: "If setup is abandoned after dispatch or its acknowledgement is lost, it reports OUTCOME_UNKNOWN. Beachside never starts the command again to recover from an uncertain result.",
    needs: "proxy",
    async run(t) {
      const marker = "setup-" + Math.random().toString(36).slice(2);
      const start = new RegExp(`^/sandboxes/${t.sandbox.id}/exec-stream$`);
      const cut = t.proxy.cutAnswer("POST", start);
      await rejects(t.via.processes.start({ command: sh(`echo ${marker}; sleep 30`), output: stream }), "OUTCOME_UNKNOWN");
      await cut.answer;
      const started = (await t.sandbox.processes.list()).filter((p) => p.args?.some((a) => a.includes(marker)));
      eq(started.length, 1);
      await t.sandbox.transport.call("DELETE", t.sandbox.path(`/exec-stream/${started[0].id}`));
    },
  },
  {
    section: "finite",
    sentence: "processes.start() rejects deadlineSeconds before starting because it cannot guarantee a portable runtime deadline.",
    async run(t) {
      const n = (await t.sandbox.processes.list()).length;
      await rejects(t.sandbox.processes.start({ command: sh("true"), deadlineSeconds: 5 }), "INVALID_ARGUMENT");
      eq((await t.sandbox.processes.list()).length, n);
    },
  },
  {
    section: "finite",
    sentence: "Output replay and cursors are unsupported.",
    deviation: "Every attach replays what kilnd still has of the output from the offsets asked for, then the live tail; a handle's position is a per-stream cursor.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("echo early"), output: stream });
      await child.wait();
      await child.detach();
      const late = await t.sandbox.processes.get(child.id);
      eq((await collect(late)).stdout, "early\n");
      await late.detach();
    },
  },
  {
    section: "finite",
    sentence: "Output a process's children write after the process exits is output, bounded by the drain time.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("(sleep 0.3; echo late) & echo early"), output: stream });
      eq((await collect(child)).stdout, "early\nlate\n");
      const r = await child.wait();
      deep([r.exitCode, r.outputCut, r.outputComplete], [0, null, true]);
      await child.detach();
      const cut = await t.sandbox.processes.start({ command: sh("sleep 30 & echo started"), output: stream, drainMs: 200 });
      eq((await collect(cut)).stdout, "started\n");
      const c = await cut.wait();
      deep([c.exitCode, c.outputCut, c.outputComplete], [0, "drain_timeout", false]);
      await cut.detach();
    },
  },

  // Live callbacks on bounded exec.
  {
    section: "exec",
    sentence: "Beachside awaits onOutput for each chunk and captures the original bytes from the same command.",
    async run(t) {
      let inCallback = 0;
      const seen = [];
      const r = await t.sandbox.exec({ command: sh("printf '\\377'; echo a; echo b >&2") }, {
        onOutput: async (c) => {
          ok(inCallback++ === 0, "a callback while one was awaited");
          seen.push(c.stream + ":" + c.text);
          await tick(5);
          inCallback--;
        },
      });
      eq(r.exitCode, 0);
      eq(r.stdout, "\uFFFDa\n");
      ok(seen.join("").includes("a\n") && seen.join("").includes("b\n"));
    },
  },
  {
    section: "exec",
    sentence: "Beachside never runs the command again as a fallback.",
    needs: "proxy",
    async run(t) {
      const marker = "exec-once-" + Math.random().toString(36).slice(2);
      const cut = t.proxy.cutRequest("GET", new RegExp(`^/sandboxes/${t.sandbox.id}/exec-stream/[^/]+/logs`));
      await t.via.exec({ command: sh(`echo ${marker}`) }, { onOutput: () => {} }).catch((e) => e);
      cut.remove();
      const runs = (await t.sandbox.processes.list()).filter((p) => p.args?.some((a) => a.includes(marker)));
      eq(runs.length, 1);
    },
  },
  {
    section: "exec",
    sentence: "Finite stdin is split into writes followed by EOF.",
    async run(t) {
      const input = "x".repeat(200_000);
      const r = await t.sandbox.exec({ command: sh("wc -c"), stdin: input }, { onOutput: () => {} });
      eq(r.stdout.trim(), "200000");
    },
  },
  {
    section: "exec",
    sentence: "Callback exec rejects an explicit deadlineSeconds before starting.",
    async run(t) {
      const n = (await t.sandbox.processes.list()).length;
      await rejects(t.sandbox.exec({ command: sh("true"), deadlineSeconds: 5 }, { onOutput: () => {} }), "INVALID_ARGUMENT");
      eq((await t.sandbox.processes.list()).length, n);
    },
  },
  {
    section: "exec",
    sentence: "The error keeps the original failure as cause, and any already confirmed exit and captured bytes as confirmedExit and output. Callback failure or local cancellation does not request termination.",
    async run(t) {
      const boom = new Error("boom");
      const marker = "exec-throws-" + Math.random().toString(36).slice(2);
      const err = await t.sandbox.exec({ command: sh(`echo ${marker}; sleep 30`) }, { onOutput: () => { throw boom; } }).catch((e) => e);
      isError(err, "INTERNAL");
      eq(err.cause, boom);
      eq(err.output.stdout, marker + "\n");
      const p = (await t.sandbox.processes.list()).find((x) => x.args?.some((a) => a.includes(marker)));
      eq(p.state, "running");
      await t.sandbox.transport.call("DELETE", t.sandbox.path(`/exec-stream/${p.id}`));
    },
  },
  {
    section: "exec",
    sentence: "The capture limit bounds retained bytes and reports truncation; it does not limit the total text sent to callbacks.",
    async run(t) {
      let sent = 0;
      const r = await t.sandbox.exec({ command: sh("seq 1 10000"), maxOutputBytes: 10 }, { onOutput: (c) => (sent += c.text.length) });
      eq(r.stdout.length, 10);
      eq(r.truncated, true);
      eq(sent, r.stdoutBytes);
      ok(sent > 10);
    },
  },

  // readProcessLines.
  {
    section: "readProcessLines",
    sentence: "readProcessLines(child.output(), { maxLineBytes: 16_384, signal }) yields { stream, text, partial, truncated }.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("echo one; echo two >&2"), output: stream });
      const lines = [];
      for await (const l of readProcessLines(child.output(), { maxLineBytes: 16_384, signal: AbortSignal.timeout(10_000) })) lines.push(l);
      deep(lines.sort((a, b) => a.stream.localeCompare(b.stream)), [
        { stream: "stderr", text: "two", partial: false, truncated: false },
        { stream: "stdout", text: "one", partial: false, truncated: false },
      ]);
      await child.detach();
    },
  },
  {
    section: "readProcessLines",
    sentence: "It handles UTF-8 characters split across chunks and Windows-style CRLF newlines separately for stdout and stderr.",
    async run() {
      const euro = encode("€");
      async function* chunks() {
        yield { stream: "stdout", bytes: euro.subarray(0, 1), offset: 0, seq: 0, lost: 0 };
        yield { stream: "stderr", bytes: encode("e\r"), offset: 0, seq: 1, lost: 0 };
        yield { stream: "stdout", bytes: concat([euro.subarray(1), encode("\r\n")]), offset: 1, seq: 3, lost: 0 };
        yield { stream: "stderr", bytes: encode("\n"), offset: 2, seq: 7, lost: 0 };
      }
      const lines = [];
      for await (const l of readProcessLines(chunks())) lines.push([l.stream, l.text]);
      deep(lines, [["stdout", "€"], ["stderr", "e"]]);
    },
  },
  {
    section: "readProcessLines",
    sentence: "It clips oversized lines, marks them truncated and discards the rest until the next newline.",
    async run() {
      async function* chunks() {
        yield chunk("stdout", "abcdef");
        yield chunk("stdout", "ghi\nnext\n");
      }
      const lines = [];
      for await (const l of readProcessLines(chunks(), { maxLineBytes: 4 })) lines.push([l.text, l.truncated]);
      deep(lines, [["abcd", true], ["next", false]]);
    },
  },
  {
    section: "readProcessLines",
    sentence: "A final line without a newline is marked partial.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("printf 'whole\\nend'"), output: stream });
      const lines = [];
      for await (const l of readProcessLines(child.output())) lines.push([l.text, l.partial]);
      deep(lines, [["whole", false], ["end", true]]);
      await child.detach();
    },
  },
  {
    section: "readProcessLines",
    sentence: "For a quiet process, the iterator waits for output or cancellation.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("echo first; sleep 30"), output: stream });
      const ac = new AbortController();
      const lines = [];
      const err = await rejects((async () => {
        for await (const l of readProcessLines(child.output(), { signal: ac.signal })) {
          lines.push(l.text);
          ac.abort(); // quiet now: the abort ends the wait at once
        }
      })(), "WAIT_ABORTED");
      ok(err);
      deep(lines, ["first"]);
      // Over a caller's own iterable, which never returns: the abort ends it too.
      async function* forever() {
        yield chunk("stdout", "x\n");
        await new Promise(() => {});
      }
      const ac2 = new AbortController();
      const own = (async () => {
        for await (const _ of readProcessLines(forever(), { signal: ac2.signal })) ac2.abort();
      })();
      await within(rejects(own, "WAIT_ABORTED"), 5000, "the caller's own iterable stopped on abort");
      await child.terminate();
      await child.detach();
    },
  },
  {
    section: "readProcessLines",
    sentence: "In stream mode, cancellation releases only output observation.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("echo ready; read x; echo got-$x"), stdin: "pipe", output: stream });
      const ac = new AbortController();
      await rejects((async () => {
        for await (const _ of readProcessLines(child.output(), { signal: ac.signal })) ac.abort();
      })(), "WAIT_ABORTED");
      await child.write("more\n");
      eq(await readUntil(child, "got-more\n"), "got-more\n");
      eq((await child.wait()).exitCode, 0);
      await child.detach();
    },
  },

  // createProcessTail.
  {
    section: "createProcessTail",
    sentence: "createProcessTail({ maxBytes: 65_536, maxChunks: 256, maxLines: 200, maxLineBytes: 16_384 }) keeps a rolling window of recent output.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("seq 1 5000"), output: stream });
      const tail = createProcessTail({ maxBytes: 65_536, maxChunks: 256, maxLines: 200, maxLineBytes: 16_384 });
      for await (const c of child.output()) tail.push(c);
      const s = tail.snapshot();
      eq(s.lines.length, 200);
      eq(s.lines.at(-1).text, "5000");
      eq(s.lines[0].text, "4801");
      eq(s.truncated, true); // earlier lines discarded, and it says so
      await child.detach();
    },
  },
  {
    section: "createProcessTail",
    sentence: "tail.snapshot() immediately returns { lines, truncated }, even when the process is quiet.",
    async run(t) {
      const child = await t.sandbox.processes.start({ command: sh("echo only; sleep 30"), output: stream });
      const tail = createProcessTail();
      for await (const c of child.output()) {
        tail.push(c);
        if (c.text.includes("only")) break;
      }
      const s = tail.snapshot();
      ok(!(s instanceof Promise));
      deep(s, { lines: [{ stream: "stdout", text: "only", partial: false, truncated: false }], truncated: false });
      await child.terminate();
      await child.detach();
    },
  },
  {
    section: "createProcessTail",
    sentence: "Each snapshot is independent and can contain partial lines.",
    async run() {
      const tail = createProcessTail();
      tail.push(chunk("stdout", "a\npar"));
      const first = tail.snapshot();
      tail.push(chunk("stdout", "tial\n"));
      deep(first.lines.map((l) => [l.text, l.partial]), [["a", false], ["par", true]]);
      deep(tail.snapshot().lines.map((l) => [l.text, l.partial]), [["a", false], ["partial", false]]);
    },
  },
  {
    section: "createProcessTail",
    sentence: "Discarding old output can leave the window starting in the middle of a character or line; the truncation flag records that gap.",
    async run() {
      const tail = createProcessTail({ maxBytes: 4 });
      tail.push({ stream: "stdout", bytes: encode("A€xy"), offset: 0, seq: 0, lost: 0 });
      const s = tail.snapshot();
      eq(s.truncated, true);
      ok(s.lines[0].text.startsWith("\uFFFD"));
      const gap = createProcessTail();
      gap.push(chunk("stdout", "x\n"));
      eq(gap.snapshot().truncated, false);
      gap.push({ stream: "stdout", text: "", offset: 10, seq: 0, lost: 8 });
      eq(gap.snapshot().truncated, true);
    },
  },
  {
    section: "createProcessTail",
    sentence: "Neither helper stores a full transcript, fetches old provider logs or stops the remote process.",
    needs: "proxy",
    async run(t) {
      const child = await t.via.processes.start({ command: sh("seq 1 3000; echo waiting; sleep 30"), output: stream });
      const tail = createProcessTail({ maxLines: 5 });
      for await (const l of readProcessLines(child.output())) {
        tail.push(chunk(l.stream, l.text + "\n"));
        if (l.text === "waiting") break;
      }
      eq(tail.snapshot().lines.length, 5);
      eq(t.proxy.count("DELETE", processPath(t, child)), 0);
      eq(t.proxy.count("GET", new RegExp(`^/sandboxes/${t.sandbox.id}/logs`)), 0, "captured logs fetched");
      eq((await record(t, child)).state, "running");
      await child.terminate();
      await child.detach();
    },
  },
];

/** The SandkilnError class, for runners that report error codes. */
export { SandkilnError };
