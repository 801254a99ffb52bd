// The SDK's own WebSocket client on Node, against a server written here
// frame by frame: what kilnd never sends (fragments, pings, masked frames,
// a wrong handshake, frames cut at every byte) is sent on purpose. Node
// only: the other runtimes keep their own WebSocket, and their tests here
// would be skipped ones (Deno's runner, given a skipped test, may end the
// file without its hooks).

import { test, afterEach } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { createHash } from "node:crypto";

import { NodeSocket, nodeModules } from "../dist/nodesocket.js";

const node = !globalThis.Bun && !globalThis.Deno;
const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/** A frame as a server sends it (unmasked unless mask is given). */
function frame(op, payload, { fin = true, mask, rsv = 0 } = {}) {
  const p = typeof payload === "string" ? Buffer.from(payload) : Buffer.from(payload ?? []);
  const n = p.length;
  const head = n < 126 ? Buffer.from([0, n]) : n < 65536 ? Buffer.from([0, 126, n >> 8, n & 0xff]) : Buffer.alloc(10);
  if (n >= 65536) {
    head[1] = 127;
    head.writeBigUInt64BE(BigInt(n), 2);
  }
  head[0] = (fin ? 0x80 : 0) | rsv | op;
  if (!mask) return Buffer.concat([head, p]);
  head[1] |= 0x80;
  const m = Buffer.from(mask);
  return Buffer.concat([head, m, Buffer.from(p.map((b, i) => b ^ m[i & 3]))]);
}

/** Reads a client's frames from the bytes after the handshake, unmasking them; each must be masked. */
function clientFrames(buf) {
  const out = [];
  let at = 0;
  for (;;) {
    if (buf.length - at < 2) break;
    let n = buf[at + 1] & 0x7f;
    let size = 2;
    if (n === 126) [n, size] = [buf.readUInt16BE(at + 2), 4];
    else if (n === 127) [n, size] = [Number(buf.readBigUInt64BE(at + 2)), 10];
    assert.ok(buf[at + 1] & 0x80, "a client frame not masked");
    if (buf.length - at < size + 4 + n) break;
    const mask = buf.subarray(at + size, at + size + 4);
    const payload = Buffer.from(buf.subarray(at + size + 4, at + size + 4 + n).map((b, i) => b ^ mask[i & 3]));
    out.push({ fin: !!(buf[at] & 0x80), op: buf[at] & 0x0f, payload });
    at += size + 4 + n;
  }
  return { frames: out, rest: buf.subarray(at) };
}

/**
 * A server that answers the handshake (or answer(req) when given) and
 * then runs script(conn) with conn: send(buf), next() (the client's next
 * frame), end(), the request's headers.
 */
// What a failed test leaves is ended after it, so that it fails, not hangs.
const open = new Set();
const servers = new Set();

async function server(script, { answer } = {}) {
  const done = [];
  const srv = net.createServer((sock) => {
    open.add(sock);
    let buf = Buffer.alloc(0);
    let headers;
    const waiting = [];
    const frames = [];
    const pump = () => {
      while (frames.length && waiting.length) waiting.shift().resolve(frames.shift());
    };
    sock.on("close", () => {
      open.delete(sock);
      for (const w of waiting.splice(0)) w.reject(new Error("the client's connection closed"));
    });
    sock.on("data", (b) => {
      buf = Buffer.concat([buf, b]);
      if (!headers) {
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const lines = buf.subarray(0, end).toString("latin1").split("\r\n");
        headers = { line: lines[0] };
        for (const l of lines.slice(1)) headers[l.slice(0, l.indexOf(":")).toLowerCase()] = l.slice(l.indexOf(":") + 1).trim();
        buf = buf.subarray(end + 4);
        const accept = createHash("sha1").update(headers["sec-websocket-key"] + GUID).digest("base64");
        sock.write(answer ? answer(headers, accept) :
          `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n` +
          `Sec-WebSocket-Protocol: ${headers["sec-websocket-protocol"].split(",")[0].trim()}\r\n\r\n`);
        done.push(script({
          headers,
          send: (b) => sock.write(b),
          next: () => new Promise((resolve, reject) => { waiting.push({ resolve, reject }); pump(); }),
          end: () => sock.end(),
          destroy: () => sock.destroy(),
          sock,
        }));
      }
      const { frames: fs, rest } = clientFrames(buf);
      buf = rest;
      frames.push(...fs);
      pump();
    });
    sock.on("error", () => {});
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  servers.add(srv);
  return {
    url: `ws://127.0.0.1:${srv.address().port}/a/path?x=1`,
    async close() {
      await Promise.all(done);
      servers.delete(srv);
      await new Promise((r) => srv.close(r));
    },
  };
}

/** A socket to url, with its events recorded; opened resolves at its open, closed at its close. */
function connect(url, { borrow = false, protocols = ["kiln.v1", "kiln.token.t"] } = {}) {
  const s = new NodeSocket(url, protocols, nodeModules(), borrow);
  const ev = { messages: [], errors: [], close: undefined };
  let opened, closed;
  ev.opened = new Promise((r) => (opened = r));
  ev.closed = new Promise((r) => (closed = r));
  const waiters = [];
  s.onopen = () => opened(true);
  s.onmessage = (e) => {
    // A lent view is copied here, as the SDK's handler copies what it keeps.
    const d = e.data;
    ev.messages.push(typeof d === "string" ? d : d instanceof Uint8Array ? { lent: true, bytes: Buffer.from(d) } : { bytes: Buffer.from(new Uint8Array(d)), buffer: d });
    while (waiters.length && waiters[0].n <= ev.messages.length) waiters.shift().r();
  };
  s.onerror = (e) => ev.errors.push(e.message);
  s.onclose = (e) => {
    ev.close = e;
    opened(false);
    closed(e);
  };
  ev.messagesIn = (n) => new Promise((r) => (ev.messages.length >= n ? r() : waiters.push({ n, r })));
  return { s, ev };
}

if (node) {
  afterEach(() => {
    for (const s of open) s.destroy();
    for (const s of servers) s.close();
    servers.clear();
  });

  test("the Node socket: the handshake as RFC 6455 asks, the chosen subprotocol, text and binary messages of every length field", { timeout: 60000 }, async () => {
    const sizes = [0, 1, 125, 126, 65535, 65536, 300000];
    const srv = await server(async (c) => {
      assert.equal(c.headers.line, "GET /a/path?x=1 HTTP/1.1");
      assert.equal(c.headers.upgrade, "websocket");
      assert.match(c.headers.connection, /upgrade/i);
      assert.equal(c.headers["sec-websocket-version"], "13");
      assert.equal(Buffer.from(c.headers["sec-websocket-key"], "base64").length, 16);
      assert.equal(c.headers["sec-websocket-protocol"], "kiln.v1, kiln.token.t");
      assert.equal(c.headers["sec-websocket-extensions"], undefined);
      c.send(frame(1, "héllo"));
      for (const n of sizes) c.send(frame(2, Buffer.alloc(n, n % 251)));
      // What the client sends, masked, each length field too.
      for (const n of sizes) {
        const f = await c.next();
        assert.equal(f.op, 2);
        assert.deepEqual(f.payload, Buffer.alloc(n, (n + 1) % 251));
      }
      const t = await c.next();
      assert.equal(t.op, 1);
      assert.equal(t.payload.toString(), "{\"type\":\"credit\"}");
      c.send(frame(8, Buffer.from([0x03, 0xe8])));
      assert.equal((await c.next()).op, 8);
      c.end();
    });
    const { s, ev } = connect(srv.url);
    assert.equal(await ev.opened, true);
    assert.equal(s.protocol, "kiln.v1");
    await ev.messagesIn(1 + sizes.length);
    assert.equal(ev.messages[0], "héllo");
    for (const [i, n] of sizes.entries()) {
      const m = ev.messages[i + 1];
      assert.ok(m.buffer instanceof ArrayBuffer, "a binary message is an ArrayBuffer of its own");
      assert.deepEqual(m.bytes, Buffer.alloc(n, n % 251));
    }
    for (const n of sizes) s.send(new Uint8Array(n).fill((n + 1) % 251));
    s.send(JSON.stringify({ type: "credit" }));
    const close = await ev.closed;
    assert.equal(close.code, 1000);
    assert.deepEqual(ev.errors, []);
    await srv.close();
  });

  test("the Node socket: frames cut at every byte, fragments with a ping between them, lent views", { timeout: 60000 }, async () => {
    const big = Buffer.alloc(70000);
    for (let i = 0; i < big.length; i++) big[i] = (i * 7) % 256;
    const stream = Buffer.concat([
      frame(2, big.subarray(0, 1000), { fin: false }),
      frame(9, "are you there"),
      frame(0, big.subarray(1000, 69000), { fin: false }),
      frame(0, big.subarray(69000), { fin: true }),
      frame(1, "€uro", { fin: false }), frame(0, "s", { fin: true }),
      frame(2, big.subarray(0, 130)),
      frame(10, "unasked pong"),
      frame(2, "after"),
    ]);
    for (const borrow of [false, true]) {
      for (const cut of [1, 3, 4096]) {
        const srv = await server(async (c) => {
          // A write at a time, each waited for: the client reads pieces.
          for (let i = 0; i < stream.length; i += cut) {
            await new Promise((r) => c.sock.write(stream.subarray(i, i + cut), r));
          }
          const pong = await c.next();
          assert.equal(pong.op, 10);
          assert.equal(pong.payload.toString(), "are you there");
          c.send(frame(8, Buffer.concat([Buffer.from([0x0f, 0xa1]), Buffer.from("done")])));
          const echo = await c.next();
          assert.equal(echo.op, 8);
          assert.equal(echo.payload.readUInt16BE(0), 4001);
          c.end();
        });
        const { ev } = connect(srv.url, { borrow });
        const close = await ev.closed;
        assert.equal(close.code, 4001, `cut ${cut}`);
        assert.equal(close.reason, "done");
        assert.deepEqual(ev.errors, []);
        assert.equal(ev.messages.length, 4, `cut ${cut}: ${JSON.stringify(ev.messages.map((m) => typeof m))}`);
        assert.deepEqual(ev.messages[0].bytes, big);
        assert.equal(ev.messages[1], "€uros");
        assert.deepEqual(ev.messages[2].bytes, big.subarray(0, 130));
        assert.deepEqual(ev.messages[3].bytes, Buffer.from("after"));
        if (borrow) assert.ok(ev.messages[2].lent, "borrow: a lent view");
        await srv.close();
      }
    }
  });

  test("the Node socket: a binary message's ArrayBuffer is its own, never the read buffer", { timeout: 60000 }, async () => {
    const srv = await server(async (c) => {
      c.send(Buffer.concat([frame(2, Buffer.alloc(1000, 1)), frame(2, Buffer.alloc(1000, 2))]));
      c.send(frame(8, Buffer.from([0x03, 0xe8])));
      await c.next();
      c.end();
    });
    const { ev } = connect(srv.url);
    await ev.closed;
    const [a, b] = ev.messages;
    assert.ok(a.buffer !== b.buffer, "two messages share a buffer");
    assert.equal(a.buffer.byteLength, 1000);
    new Uint8Array(a.buffer).fill(9);
    assert.deepEqual(Buffer.from(new Uint8Array(b.buffer)), Buffer.alloc(1000, 2));
    await srv.close();
  });

  test("the Node socket: close() sends its code and reason, drops what comes after, and closes with the server's answer", { timeout: 60000 }, async () => {
    let heard;
    const srv = await server(async (c) => {
      c.send(frame(1, "hi"));
      heard = await c.next();
      c.send(frame(2, "late"));
      c.send(frame(8, heard.payload.subarray(0, 2)));
      c.end();
    });
    const { s, ev } = connect(srv.url);
    await ev.messagesIn(1);
    s.close(1000, "bye");
    s.send("dropped"); // closing: nothing sent, nothing thrown
    const close = await ev.closed;
    assert.equal(heard.op, 8);
    assert.equal(heard.payload.readUInt16BE(0), 1000);
    assert.equal(heard.payload.subarray(2).toString(), "bye");
    assert.equal(close.code, 1000);
    assert.deepEqual(ev.messages, ["hi"]);
    assert.deepEqual(ev.errors, []);
    await srv.close();
  });

  test("the Node socket: what is not a WebSocket's answer fails the open, saying why", { timeout: 60000 }, async () => {
    const answers = {
      "Unexpected server response: 403": () => "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
      "Sec-WebSocket-Accept is wrong": () => "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: AAAA\r\n\r\n",
      "a subprotocol not offered": (_, accept) => `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\nSec-WebSocket-Protocol: other\r\n\r\n`,
      "an extension not offered": (_, accept) => `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n`,
    };
    for (const [why, answer] of Object.entries(answers)) {
      const srv = await server(async () => {}, { answer });
      const { ev } = connect(srv.url);
      assert.equal(await ev.opened, false, why);
      assert.equal(ev.close.code, 1006);
      assert.ok(ev.errors.some((e) => e.includes(why)), `${why}: ${ev.errors}`);
      await srv.close();
    }
    // Nothing listening.
    const l = net.createServer();
    await new Promise((r) => l.listen(0, "127.0.0.1", r));
    const port = l.address().port;
    await new Promise((r) => l.close(r));
    const { ev } = connect(`ws://127.0.0.1:${port}/`);
    assert.equal(await ev.opened, false);
    assert.match(ev.errors[0], /ECONNREFUSED/);
  });

  test("the Node socket: a server's protocol error closes with 1002 sent, and a connection cut without a close is 1006", { timeout: 60000 }, async () => {
    for (const bad of [frame(2, "x", { mask: [1, 2, 3, 4] }), frame(2, "x", { rsv: 0x40 }), frame(0, "x"), frame(9, "x", { fin: false }), frame(1, Buffer.from([0xff]))]) {
      let heard;
      const srv = await server(async (c) => {
        c.send(bad);
        heard = await c.next();
        c.end();
      });
      const { ev } = connect(srv.url);
      const close = await ev.closed;
      assert.equal(heard.op, 8);
      assert.ok([1002, 1007].includes(heard.payload.readUInt16BE(0)), String(heard.payload.readUInt16BE(0)));
      assert.equal(close.code, 1006);
      assert.equal(ev.messages.length, 0);
      await srv.close();
    }
    const srv = await server(async (c) => {
      c.send(frame(1, "one"));
      c.destroy();
    });
    const { ev } = connect(srv.url);
    const close = await ev.closed;
    assert.equal(close.code, 1006);
    assert.deepEqual(ev.messages, ["one"]);
    await srv.close();
  });

  test("the Node socket: pause() stops reading, so TCP holds the server back; resume() reads the rest", { timeout: 60000 }, async () => {
    let blocked;
    const written = new Promise((r) => (blocked = r));
    const srv = await server(async (c) => {
      await c.next(); // the client paused
      // Frames until the kernel's buffers are full (a client that reads
      // could not read them before this loop ends: it runs on this thread).
      const piece = frame(2, Buffer.alloc(64 << 10, 7));
      let n = 1;
      while (c.sock.write(piece)) n++;
      blocked(n);
      await new Promise((r) => c.sock.once("drain", r));
      c.send(frame(8, Buffer.from([0x03, 0xe8])));
      await c.next();
      c.end();
    });
    const { s, ev } = connect(srv.url);
    await ev.opened;
    s.pause();
    s.send("go");
    const n = await written;
    assert.ok(n * (64 << 10) < 256 << 20, `${n} frames went into a paused socket`);
    // Turns of the event loop, each with a poll for what is readable: a
    // socket reading would take frames in the first.
    for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
    assert.equal(ev.messages.length, 0, "messages read while paused");
    s.resume();
    const close = await ev.closed;
    assert.equal(close.code, 1000);
    assert.equal(ev.messages.length, n);
    await srv.close();
  });
}
