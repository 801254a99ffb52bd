// A WebSocket client of the SDK's own for Node (RFC 6455: the opening
// handshake, masked client frames, fragmented messages, ping and pong, the
// closing handshake; no extension is offered, so none is spoken), over
// node:net or node:tls. Node 22's WebSocket reassembles each message from
// the socket's reads with a copy or more of every byte, and Node 20 has
// none: a burst of output cost Node more in its WebSocket than in anything
// else. This one reads into one buffer it keeps and, for a listener that
// copies what it keeps, gives a binary message as a view of that buffer.
// Bun, Deno and browsers keep their own WebSocket.

import type { Socket } from "./socket.js";

// The parts of Node's modules used here (the SDK is built without Node's types).
interface NodeStream {
  readonly writableLength: number;
  setNoDelay?(on: boolean): void;
  write(b: Uint8Array): boolean;
  end(): void;
  destroy(): void;
  pause(): void;
  resume(): void;
  on(event: "connect" | "secureConnect" | "end" | "close", f: () => void): void;
  on(event: "data", f: (b: Uint8Array) => void): void;
  on(event: "error", f: (e: Error) => void): void;
}
interface NodeModules {
  net: { connect(o: object): NodeStream };
  tls: { connect(o: object): NodeStream };
  crypto: {
    randomFillSync(b: Uint8Array): Uint8Array;
    createHash(alg: string): { update(s: string): { digest(enc: "base64"): string } };
  };
}

/** Node's modules, on a Node that has process.getBuiltinModule (20.16 and later). */
export function nodeModules(): NodeModules {
  const get = (globalThis as unknown as { process: { getBuiltinModule(id: string): unknown } }).process.getBuiltinModule;
  return { net: get("node:net"), tls: get("node:tls"), crypto: get("node:crypto") } as NodeModules;
}

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/** The answer to the opening handshake, its headers, at most. */
const MAX_HEAD = 16 << 10;
/** A message, at most (kiln.v1's are 256 KiB and a header). */
const MAX_MESSAGE = 64 << 20;
/** What one read takes at most, into the buffer kept for reads. */
const READ_BUFFER = 256 << 10;
/** How long a close waits for the server's half of the closing handshake. */
const CLOSE_WAIT_MS = 5000;

const CONNECTING = 0;
const OPEN = 1;
const CLOSING = 2;
const CLOSED = 3;

const utf8 = new TextDecoder("utf-8", { fatal: true });
const encoder = new TextEncoder();

/**
 * One WebSocket connection, with the part of the WebSocket API the SDK
 * uses, and pause() and resume() (TCP holds the server back). Binary
 * messages are ArrayBuffers of their own, or, when borrow is set, a
 * Uint8Array valid only while onmessage runs.
 */
export class NodeSocket implements Socket {
  protocol = "";
  binaryType = "arraybuffer";
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;

  private state: number = CONNECTING;
  private readonly stream: NodeStream;
  private readonly key: string;
  private readonly offered: string[];
  private readonly borrow: boolean;
  private readonly crypto: NodeModules["crypto"];
  /** The opening handshake's answer so far. */
  private head = "";
  /** A frame not yet whole: its bytes so far (carry[0:carried]). */
  private carry = new Uint8Array(0);
  private carried = 0;
  /** A fragmented message's frames so far, and its opcode. */
  private fragments: Uint8Array[] = [];
  private fragmentBytes = 0;
  private fragmentOp = 0;
  private closeCode = 1006;
  private closeReason = "";
  private closeSent = false;
  private closeTimer: ReturnType<typeof setTimeout> | undefined;
  private closedFired = false;
  /** The server broke the protocol: what it sends is not read. */
  private broken = false;
  private masks: Uint8Array = new Uint8Array(0);
  private maskAt = 0;

  constructor(url: string, protocols: string[], mods: NodeModules, borrow = false) {
    const u = new URL(url);
    const secure = u.protocol === "wss:";
    if (!secure && u.protocol !== "ws:") throw new SyntaxError(`not a WebSocket URL: ${url}`);
    this.offered = protocols;
    this.borrow = borrow;
    this.crypto = mods.crypto;
    this.key = base64(mods.crypto.randomFillSync(new Uint8Array(16)));
    const host = u.hostname.replace(/^\[(.*)\]$/, "$1");
    const port = Number(u.port) || (secure ? 443 : 80);
    const request =
      `GET ${u.pathname || "/"}${u.search} HTTP/1.1\r\n` +
      `Host: ${u.host}\r\n` +
      "Upgrade: websocket\r\nConnection: Upgrade\r\n" +
      `Sec-WebSocket-Key: ${this.key}\r\nSec-WebSocket-Version: 13\r\n` +
      (protocols.length ? `Sec-WebSocket-Protocol: ${protocols.join(", ")}\r\n` : "") +
      "\r\n";
    if (secure) {
      const servername = /^[\d.]+$|:/.test(host) ? undefined : host;
      this.stream = mods.tls.connect({ host, port, servername, ALPNProtocols: ["http/1.1"] });
      this.stream.on("data", (b) => this.received(b));
    } else {
      // Reads go into one buffer, kept: the frames are parsed from it as
      // it is filled, and only what a listener keeps is copied.
      const buffer = new Uint8Array(READ_BUFFER);
      this.stream = mods.net.connect({
        host, port,
        onread: { buffer, callback: (n: number, b: Uint8Array) => this.received(b.subarray(0, n)) },
      });
    }
    this.stream.setNoDelay?.(true);
    this.stream.on(secure ? "secureConnect" : "connect", () => {
      if (this.state === CONNECTING) this.stream.write(encoder.encode(request));
    });
    this.stream.on("error", (e) => this.fail(1006, e.message));
    this.stream.on("end", () => this.stream.end());
    this.stream.on("close", () => this.fail(this.closeCode, this.closeReason));
  }

  get readyState(): number {
    return this.state;
  }

  /** Bytes sent and not yet handed to the kernel. */
  get bufferedAmount(): number {
    return this.stream.writableLength;
  }

  send(data: string | ArrayBufferView | ArrayBuffer): void {
    if (this.state === CONNECTING) throw new Error("the WebSocket is not open yet");
    if (this.state !== OPEN) return; // as a browser's: dropped once closing
    if (typeof data === "string") this.frame(1, encoder.encode(data));
    else if (data instanceof ArrayBuffer) this.frame(2, new Uint8Array(data));
    else this.frame(2, new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  }

  close(code?: number, reason?: string): void {
    if (this.state === CLOSING || this.state === CLOSED) return;
    if (this.state === CONNECTING) {
      this.fail(1006, "");
      return;
    }
    this.state = CLOSING;
    this.sendClose(code ?? 1005, reason ?? "");
  }

  pause(): void {
    if (this.state === OPEN) this.stream.pause();
  }

  resume(): void {
    this.stream.resume();
  }

  /** Sends a close frame (1005: none, a close without a code) and waits a while for the server's end. */
  private sendClose(code: number, reason: string): void {
    if (this.closeSent) return;
    this.closeSent = true;
    let body = new Uint8Array(0);
    if (code !== 1005) {
      const r = encoder.encode(reason).subarray(0, 123);
      body = new Uint8Array(2 + r.length);
      body[0] = code >> 8;
      body[1] = code & 0xff;
      body.set(r, 2);
    }
    this.frame(8, body);
    // What the server still sends is read, and dropped, until its close.
    this.stream.resume();
    this.closeTimer = setTimeout(() => this.stream.destroy(), CLOSE_WAIT_MS);
  }

  /** Ends the connection, once: its close (and, before it opened or on a failure, its error) told. */
  private fail(code: number, reason: string): void {
    if (this.closedFired) return;
    const wasOpen = this.state === OPEN || this.state === CLOSING;
    const clean = this.closeSent && code !== 1006;
    this.state = CLOSED;
    this.closedFired = true;
    if (this.closeTimer) clearTimeout(this.closeTimer);
    this.stream.destroy();
    if (!wasOpen || !clean) this.onerror?.({ message: reason || "the WebSocket connection failed" });
    this.onclose?.({ code, reason });
  }

  /** A protocol error of the server's: nothing more is read; the close says code, and the connection ends. */
  private protocolError(code: number, why: string): void {
    this.broken = true;
    this.closeCode = 1006;
    this.closeReason = why;
    if (this.state === OPEN) this.state = CLOSING;
    this.sendClose(code, why);
    this.stream.end();
  }

  private received(b: Uint8Array): void {
    if (this.state === CLOSED || this.broken) return;
    if (this.state === CONNECTING) {
      const rest = this.handshake(b);
      if (rest) this.frames(rest);
      return;
    }
    this.frames(b);
  }

  /** Reads the opening handshake's answer: once it opened, what follows the answer (frames), else null. */
  private handshake(b: Uint8Array): Uint8Array | null {
    // Latin-1: one character a byte, so that the header's end is an index into b.
    let text = "";
    for (let i = 0; i < b.length; i += 8192) text += String.fromCharCode(...b.subarray(i, i + 8192));
    const before = this.head.length;
    this.head += text;
    const end = this.head.indexOf("\r\n\r\n");
    if (end < 0) {
      if (this.head.length > MAX_HEAD) this.fail(1006, "the WebSocket's answer has too long a header");
      return null;
    }
    const lines = this.head.slice(0, end).split("\r\n");
    const status = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? "");
    const headers: Record<string, string> = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(":");
      if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
    }
    const accept = this.crypto.createHash("sha1").update(this.key + GUID).digest("base64");
    const protocol = headers["sec-websocket-protocol"] ?? "";
    let why = "";
    if (!status) why = "the WebSocket's answer is not HTTP";
    else if (status[1] !== "101") why = `Unexpected server response: ${status[1]}`;
    else if ((headers["upgrade"] ?? "").toLowerCase() !== "websocket" || !/\bupgrade\b/i.test(headers["connection"] ?? "")) why = "the server did not upgrade to a WebSocket";
    else if (headers["sec-websocket-accept"] !== accept) why = "the server's Sec-WebSocket-Accept is wrong";
    else if (protocol && !this.offered.includes(protocol)) why = `the server chose a subprotocol not offered (${protocol})`;
    else if (headers["sec-websocket-extensions"]) why = "the server chose an extension not offered";
    if (why) {
      this.fail(1006, why);
      return null;
    }
    this.head = "";
    this.protocol = protocol;
    this.state = OPEN;
    this.onopen?.({});
    return b.subarray(end + 4 - before);
  }

  /** Parses and handles the frames in b, keeping a frame not yet whole for the next read. */
  private frames(b: Uint8Array): void {
    let at = 0;
    if (this.carried > 0) {
      at = this.fill(b);
      if (at < 0) return; // all of b went to the frame, and it is not whole yet
      const whole = this.carry.subarray(0, this.carried);
      this.carried = 0;
      this.frame1(whole, frameHeader(whole)!, true);
    }
    while (at < b.length && this.state !== CLOSED && !this.broken) {
      const h = frameHeader(b.subarray(at));
      if (h && at + h.size + h.length <= b.length) {
        this.frame1(b.subarray(at, at + h.size + h.length), h, false);
        at += h.size + h.length;
        continue;
      }
      if (h && h.length > MAX_MESSAGE) {
        this.protocolError(1009, "message too big");
        return;
      }
      // The frame goes on in the next read: its bytes so far are kept.
      this.carried = 0;
      this.reserve(h ? h.size + h.length : 14);
      this.fill(b.subarray(at));
      return;
    }
  }

  /** Makes room for a frame of n bytes in the carry, kept for later frames when it may be (see frame1). */
  private reserve(n: number): void {
    if (this.carry.length < n || !this.borrow) this.carry = new Uint8Array(Math.max(n, this.borrow ? READ_BUFFER + 14 : 0));
  }

  /**
   * Adds to the frame carried as much of b as it needs: the index in b
   * past its last byte once the frame is whole, -1 while it is not.
   */
  private fill(b: Uint8Array): number {
    let h = frameHeader(this.carry.subarray(0, this.carried));
    let used = 0;
    if (!h) {
      // The header first, a byte at a time: at most 14.
      while (used < b.length && !h) {
        this.carry[this.carried++] = b[used++]!;
        h = frameHeader(this.carry.subarray(0, this.carried));
      }
      if (!h) return -1;
      if (h.length > MAX_MESSAGE) {
        this.protocolError(1009, "message too big");
        return -1;
      }
      if (this.carry.length < h.size + h.length) {
        const bigger = new Uint8Array(Math.max(h.size + h.length, this.borrow ? READ_BUFFER + 14 : 0));
        bigger.set(this.carry.subarray(0, this.carried));
        this.carry = bigger;
      }
    }
    const want = h.size + h.length - this.carried;
    const take = Math.min(want, b.length - used);
    this.carry.set(b.subarray(used, used + take), this.carried);
    this.carried += take;
    return take === want ? used + take : -1;
  }

  /** Handles one whole frame f (its header h); own: f's bytes are the SDK's, not the read buffer's. */
  private frame1(f: Uint8Array, h: Header, own: boolean): void {
    const op = f[0]! & 0x0f;
    const fin = (f[0]! & 0x80) !== 0;
    if ((f[0]! & 0x70) !== 0) return this.protocolError(1002, "reserved bits set");
    if ((f[1]! & 0x80) !== 0) return this.protocolError(1002, "a masked frame from the server");
    const payload = f.subarray(h.size);
    if (op >= 8) {
      if (!fin || payload.length > 125) return this.protocolError(1002, "a control frame fragmented or too long");
      switch (op) {
        case 8: {
          const code = payload.length >= 2 ? (payload[0]! << 8) | payload[1]! : 1005;
          let reason = "";
          try {
            reason = utf8.decode(payload.subarray(2));
          } catch {
            return this.protocolError(1007, "a close reason not UTF-8");
          }
          this.closeCode = code;
          this.closeReason = reason;
          if (this.state === OPEN) this.state = CLOSING;
          // Answered, when this side did not speak first; either way both
          // have said all they will: the server ends the connection, and
          // this side's half ends now.
          this.sendClose(code, "");
          this.stream.end();
          return;
        }
        case 9:
          if (this.state === OPEN) this.frame(10, payload);
          return;
        case 10:
          return;
        default:
          return this.protocolError(1002, `opcode ${op}`);
      }
    }
    if (op === 0) {
      if (this.fragments.length === 0) return this.protocolError(1002, "a continuation of nothing");
    } else if (op === 1 || op === 2) {
      if (this.fragments.length > 0) return this.protocolError(1002, "a new message inside a fragmented one");
      if (fin) return this.message(op, payload, own);
      this.fragmentOp = op;
    } else return this.protocolError(1002, `opcode ${op}`);
    this.fragmentBytes += payload.length;
    if (this.fragmentBytes > MAX_MESSAGE) return this.protocolError(1009, "message too big");
    this.fragments.push(own && !this.borrow ? payload : payload.slice());
    if (!fin) return;
    const whole = new Uint8Array(this.fragmentBytes);
    let i = 0;
    for (const p of this.fragments) {
      whole.set(p, i);
      i += p.length;
    }
    this.fragments = [];
    this.fragmentBytes = 0;
    this.message(this.fragmentOp, whole, true);
  }

  private message(op: number, payload: Uint8Array, own: boolean): void {
    if (this.state !== OPEN) return; // after close(): dropped, as a browser does
    let data: unknown;
    if (op === 1) {
      try {
        data = utf8.decode(payload);
      } catch {
        return this.protocolError(1007, "a text message not UTF-8");
      }
    } else if (this.borrow) data = payload;
    else if (own && payload.byteOffset === 0 && payload.byteLength === payload.buffer.byteLength) data = payload.buffer;
    else data = payload.slice().buffer;
    this.onmessage?.({ data });
  }

  /** Writes one frame, masked as a client's must be. */
  private frame(op: number, payload: Uint8Array): void {
    const n = payload.length;
    const size = n < 126 ? 2 : n < 65536 ? 4 : 10;
    const f = new Uint8Array(size + 4 + n);
    f[0] = 0x80 | op;
    if (n < 126) f[1] = 0x80 | n;
    else if (n < 65536) {
      f[1] = 0x80 | 126;
      f[2] = n >> 8;
      f[3] = n & 0xff;
    } else {
      f[1] = 0x80 | 127;
      new DataView(f.buffer).setBigUint64(2, BigInt(n));
    }
    const mask = this.mask();
    f.set(mask, size);
    const at = size + 4;
    for (let i = 0; i < n; i++) f[at + i] = payload[i]! ^ mask[i & 3]!;
    this.stream.write(f);
  }

  /** Four random bytes, from a pool filled 1,024 masks at a time. */
  private mask(): Uint8Array {
    if (this.maskAt + 4 > this.masks.length) {
      this.masks = this.crypto.randomFillSync(new Uint8Array(4096));
      this.maskAt = 0;
    }
    const m = this.masks.subarray(this.maskAt, this.maskAt + 4);
    this.maskAt += 4;
    return m;
  }
}

interface Header {
  /** The header's bytes. */
  size: number;
  /** The payload's. */
  length: number;
}

/** A frame's header at the start of b, or null while b holds less than all of it. */
function frameHeader(b: Uint8Array): Header | null {
  if (b.length < 2) return null;
  const len = b[1]! & 0x7f;
  const mask = b[1]! & 0x80 ? 4 : 0;
  if (len < 126) return b.length >= 2 + mask ? { size: 2 + mask, length: len } : null;
  if (len === 126) return b.length >= 4 + mask ? { size: 4 + mask, length: (b[2]! << 8) | b[3]! } : null;
  if (b.length < 10 + mask) return null;
  const hi = (b[2]! << 24 >>> 0) + (b[3]! << 16) + (b[4]! << 8) + b[5]!;
  const lo = (b[6]! << 24 >>> 0) + (b[7]! << 16) + (b[8]! << 8) + b[9]!;
  return { size: 10 + mask, length: hi * 2 ** 32 + lo };
}

function base64(b: Uint8Array): string {
  return btoa(String.fromCharCode(...b));
}
