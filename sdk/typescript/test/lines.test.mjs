// The seed's bounded diagnostic text: readProcessLines and
// createProcessTail, over real processes and over chunks made to fall
// exactly where a bound or a character's boundary is.

import { test } from "node:test";
import assert from "node:assert/strict";

import { SandkilnError, readProcessLines, createProcessTail } from "../dist/index.js";
import { sandboxSuite } from "./suite.mjs";

let sandbox;
sandboxSuite((s) => ({ sandbox } = s));

const sh = (script) => ({ kind: "argv", argv: ["sh", "-c", script] });

async function rejects(p, code) {
  await assert.rejects(p, (err) => {
    assert.ok(err instanceof SandkilnError, `not a SandkilnError: ${err}`);
    assert.equal(err.code, code, err.message);
    return true;
  });
}

let offset = 0;
const bytes = (stream, b) => ({ stream, bytes: Uint8Array.from(b), offset: offset, seq: (offset += b.length) - b.length, lost: 0 });
const text = (stream, t) => ({ stream, text: t, offset: 0, seq: 0, lost: 0 });
const gap = (stream, n) => ({ stream, text: "", offset: 0, seq: 0, lost: n });

async function* chunks(...cs) {
  for (const c of cs) yield c;
}

async function lines(output, options) {
  const out = [];
  for await (const l of readProcessLines(output, options)) out.push(l);
  return out;
}

const brief = (ls) => ls.map((l) => [l.stream, l.text, l.partial, l.truncated]);

test("readProcessLines: a line at maxLineBytes whole, one over it clipped and marked, the rest dropped to its newline", async () => {
  // abcé is 5 bytes: clipped at 4 it would cut é, so it keeps abc.
  const child = await sandbox.processes.start({
    command: sh("printf 'abcd\\nabcdefgh\\nxy\\r\\nabcd\\r\\nabc\\303\\251\\nlast'"), output: { mode: "stream" },
  });
  assert.deepEqual(brief(await lines(child.output(), { maxLineBytes: 4 })), [
    ["stdout", "abcd", false, false],
    ["stdout", "abcd", false, true],
    ["stdout", "xy", false, false],
    ["stdout", "abcd", false, false],
    ["stdout", "abc", false, true],
    ["stdout", "last", true, false],
  ]);
  await child.detach();
  await rejects(lines(chunks(), { maxLineBytes: 0 }), "INVALID_ARGUMENT");
});

test("readProcessLines: characters split across chunks, each stream on its own, gaps skipped", async () => {
  const got = await lines(chunks(
    bytes("stdout", [0x68, 0xc3]), // h, then the first byte of é
    bytes("stderr", [0xe2, 0x82]), // two bytes of €
    bytes("stdout", [0xa9, 0x0a]),
    gap("stdout", 10),
    bytes("stderr", [0xac, 0x0d, 0x0a]),
    bytes("stdout", [0xf0, 0x9f]),
    bytes("stdout", [0x98, 0x80]), // 😀 in two halves, no newline
  ));
  assert.deepEqual(brief(got), [
    ["stdout", "hé", false, false],
    ["stderr", "€", false, false],
    ["stdout", "😀", true, false],
  ]);
});

test("readProcessLines: a quiet process waits for output or cancellation; cancelling ends the lines alone", async () => {
  const child = await sandbox.processes.start({ command: sh("echo one; read x; echo after"), stdin: "pipe", output: { mode: "stream" } });
  const ac = new AbortController();
  const it = readProcessLines(child.output(), { signal: ac.signal })[Symbol.asyncIterator]();
  assert.equal((await it.next()).value.text, "one");
  const waiting = it.next(); // nothing comes: it waits
  ac.abort();
  await rejects(waiting, "WAIT_ABORTED");
  // The process and its handle go on: input, status, and output again.
  assert.equal((await child.status()).state, "running");
  await child.write("go\n");
  let rest = "";
  for await (const c of child.output()) rest += c.text;
  assert.equal(rest, "after\n");
  assert.equal((await child.wait()).exitCode, 0);
  await child.detach();
});

test("createProcessTail: the last lines of a real process, at once while it is quiet", async () => {
  // stderr's line once all of stdout was pushed: kilnd reads the two pipes
  // apart, so without the wait for input it could come before the last
  // stdout lines, and the 200 kept would not hold it.
  const child = await sandbox.processes.start({ command: sh("seq 1 300; read x; echo err >&2; sleep 30"), stdin: "pipe", output: { mode: "stream" } });
  const tail = createProcessTail({ maxLines: 200 });
  let seen = "";
  let asked = false;
  for await (const c of child.output()) {
    tail.push(c);
    if (c.stream === "stdout") seen += c.text;
    if (seen.endsWith("300\n") && !asked) {
      asked = true;
      await child.write("\n");
    }
    if (seen.endsWith("300\n") && tail.snapshot().lines.some((l) => l.stream === "stderr")) break;
  }
  // The process is quiet (sleeping): the snapshot is given at once, not awaited.
  const snap = tail.snapshot();
  assert.ok(!(snap instanceof Promise));
  assert.equal(snap.truncated, true); // 301 lines, the first 101 discarded
  assert.equal(snap.lines.length, 200);
  const out = snap.lines.filter((l) => l.stream === "stdout").map((l) => l.text);
  assert.equal(out.at(-1), "300");
  assert.deepEqual(snap.lines.filter((l) => l.stream === "stderr").map((l) => l.text), ["err"]);
  assert.equal(out[0], "102"); // 199 stdout lines and the stderr one
  await child.terminate();
  await child.wait();
  await child.detach();
});

test("createProcessTail: its bounds, each at and over", () => {
  // maxBytes: exactly full keeps all; one byte more cuts the oldest.
  let t = createProcessTail({ maxBytes: 10 });
  t.push(text("stdout", "1234\n"));
  t.push(text("stdout", "abcd\n"));
  assert.deepEqual(t.snapshot(), { lines: [{ stream: "stdout", text: "1234", partial: false, truncated: false }, { stream: "stdout", text: "abcd", partial: false, truncated: false }], truncated: false });
  t.push(text("stdout", "X"));
  const s = t.snapshot();
  assert.equal(s.truncated, true);
  assert.deepEqual(brief(s.lines), [["stdout", "234", false, false], ["stdout", "abcd", false, false], ["stdout", "X", true, false]]);

  // A chunk larger than the window keeps its end.
  t = createProcessTail({ maxBytes: 4 });
  t.push(text("stdout", "abcdefg\n"));
  assert.deepEqual(brief(t.snapshot().lines), [["stdout", "efg", false, false]]);
  assert.equal(t.snapshot().truncated, true);

  // maxChunks.
  t = createProcessTail({ maxChunks: 2 });
  t.push(text("stdout", "a\n"));
  t.push(text("stdout", "b\n"));
  assert.equal(t.snapshot().truncated, false);
  t.push(text("stdout", "c\n"));
  assert.deepEqual(t.snapshot().lines.map((l) => l.text), ["b", "c"]);
  assert.equal(t.snapshot().truncated, true);

  // maxLines: the last ones; the lines before them are discarded, and
  // truncated says so.
  t = createProcessTail({ maxLines: 2 });
  t.push(text("stdout", "1\n2\n"));
  assert.deepEqual(t.snapshot().lines.map((l) => l.text), ["1", "2"]);
  assert.equal(t.snapshot().truncated, false);
  t.push(text("stdout", "3\n"));
  assert.deepEqual(t.snapshot(), { lines: [{ stream: "stdout", text: "2", partial: false, truncated: false }, { stream: "stdout", text: "3", partial: false, truncated: false }], truncated: true });

  // maxLineBytes.
  t = createProcessTail({ maxLineBytes: 3 });
  t.push(text("stderr", "abc\nabcd\n"));
  assert.deepEqual(brief(t.snapshot().lines), [["stderr", "abc", false, false], ["stderr", "abc", false, true]]);

  for (const bad of [{ maxBytes: 0 }, { maxChunks: 0 }, { maxLines: 1.5 }, { maxLineBytes: -1 }]) {
    assert.throws(() => createProcessTail(bad), (err) => err.code === "INVALID_ARGUMENT");
  }
});

test("createProcessTail: snapshots independent, partial lines, streams apart, a gap or a cut character marked", () => {
  const t = createProcessTail({ maxBytes: 9 });
  t.push(text("stdout", "a"));
  t.push(text("stderr", "b\n"));
  t.push(text("stdout", "c\n"));
  const first = t.snapshot();
  const copy = structuredClone(first);
  assert.deepEqual(brief(first.lines), [["stderr", "b", false, false], ["stdout", "ac", false, false]]);
  t.push(text("stdout", "tail"));
  assert.deepEqual(first, copy, "a later push changed an earlier snapshot");
  const second = t.snapshot();
  assert.deepEqual(brief(second.lines).at(-1), ["stdout", "tail", true, false]);
  assert.equal(second.truncated, false);

  // Full to the byte; then older output goes, and truncated says so.
  t.push(bytes("stdout", [0x0a, 0xe2, 0x82, 0xac, 0x0a]));
  const cut = t.snapshot();
  assert.equal(cut.truncated, true);
  assert.deepEqual(brief(cut.lines), [["stdout", "tail", false, false], ["stdout", "€", false, false]]);

  const g = createProcessTail();
  g.push(text("stdout", "x\n"));
  g.push(gap("stdout", 5));
  assert.equal(g.snapshot().truncated, true);
  const w = createProcessTail({ maxBytes: 2 });
  w.push(bytes("stdout", [0x41, 0xe2, 0x82, 0xac])); // "A€": the window begins inside €, its last two bytes
  assert.deepEqual(w.snapshot().lines.map((l) => [l.text.includes("\uFFFD"), l.partial]), [[true, true]]);
});
