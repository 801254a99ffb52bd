// A sandbox's ports reached through kilnd: HTTP by its port proxy, and a
// TCP connection carried over one WebSocket (kiln.tcp).

import { SandkilnError } from "./errors.js";
import { message } from "./http.js";
import type { SignalOptions } from "./process.js";
import { openSocket, type Socket } from "./socket.js";
import type { Sandbox } from "./client.js";

/** The bytes one message of a connection carries at most. */
const MAX_MESSAGE = 64 << 10;
/** What a connection holds unread before it stops reading (where the runtime can); below half, it reads again. */
const MAX_UNREAD = 1 << 20;
/** What write() lets the runtime hold unsent before it waits. */
const MAX_UNSENT = 256 << 10;

function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new SandkilnError("INVALID_ARGUMENT", `port ${port}: want 1 to 65535`);
  }
}

const IDEMPOTENT = new Set(["GET", "HEAD", "OPTIONS"]);

/** A sandbox's ports, each reached on 127.0.0.1 inside it, with kilnd's token. */
export class Ports {
  private readonly s: Sandbox;
  /** @internal The connections open. */
  readonly open = new Set<PortConnection>();

  /** @internal */
  constructor(s: Sandbox) {
    this.s = s;
  }

  /**
   * An HTTP request to the server on port inside the sandbox, through
   * kilnd's port proxy: path is the app's, with its query. The app's
   * answer comes back whatever its status; a redirect as it is (its
   * Location under kilnd's prefix, /sandboxes/{id}/ports/{port}), never
   * followed. kilnd's own refusals are SandkilnErrors: UNAVAILABLE with
   * kilnCode "bad_gateway" (status 502) when nothing listens on the port.
   * The Authorization header is kilnd's (its token); kilnd does not pass
   * it on. No local timeout: init.signal bounds the request.
   */
  async fetch(port: number, path: string, init: RequestInit = {}): Promise<Response> {
    checkPort(port);
    const method = (init.method ?? "GET").toUpperCase();
    const headers: Record<string, string> = {};
    new Headers(init.headers).forEach((v, k) => {
      headers[k] = v;
    });
    delete headers["authorization"];
    const body = init.body ?? undefined;
    return this.s.transport.fetch(method, this.s.path(`/ports/${port}/${path.replace(/^\/+/, "")}`), {
      headers, body: body === null ? undefined : body, idempotent: IDEMPOTENT.has(method), unbounded: true,
      signal: init.signal ?? undefined, isError: (resp) => resp.headers.has("Kiln-Error"),
    });
  }

  /**
   * Opens a TCP connection to port inside the sandbox, carried over one
   * WebSocket through kilnd, as kubectl port-forward carries one. It
   * resolves once the connection is made: nothing listening on the port
   * is kilnd's error (UNAVAILABLE, kilnCode "bad_gateway").
   */
  async connect(port: number, options: SignalOptions = {}): Promise<PortConnection> {
    checkPort(port);
    const path = this.s.path(`/tcp/${port}`);
    const { url, protocols } = this.s.transport.socket(path, undefined, "kiln.tcp");
    const conn = new PortConnection(port, () => this.open.delete(conn));
    let socket: Socket;
    try {
      socket = await openSocket(url, protocols, conn.handlers, options.signal);
    } catch (err) {
      if (options.signal?.aborted) throw new SandkilnError("WAIT_ABORTED", `connect to port ${port}: aborted`, { cause: options.signal.reason });
      throw await this.whyNotOpen(path, port, err);
    }
    conn.opened(socket);
    this.open.add(conn);
    this.s.watch();
    return conn;
  }

  /**
   * Why a connection did not open: a browser's WebSocket says nothing of
   * the answer, so the route is asked again over plain HTTP, where kilnd
   * answers its error (the port dialled first, as for the WebSocket).
   */
  private async whyNotOpen(path: string, port: number, err: unknown): Promise<SandkilnError> {
    try {
      const resp = await this.s.transport.fetch("GET", path, { idempotent: true });
      await resp.body?.cancel();
    } catch (e) {
      if (e instanceof SandkilnError && e.status !== undefined && e.kilnCode !== "internal") return e;
    }
    return new SandkilnError("UNAVAILABLE", `connect to port ${port}: ${message(err)}`, { cause: err });
  }
}

type Event = { kind: "data"; bytes: Uint8Array } | { kind: "end" } | { kind: "error"; err: SandkilnError };

/**
 * A TCP connection to a port inside a sandbox. readable gives the
 * server's bytes as they come, and ends when the server closes the
 * connection; leaving a for await loop early leaves the connection open,
 * and iterating again goes on where it stopped. write() sends bytes in
 * order; close() ends the connection, both ways (a WebSocket has no half
 * close).
 */
export class PortConnection {
  readonly port: number;
  /** Settles once the connection is closed, by either end; it never rejects. */
  readonly closed: Promise<void>;
  private socket: Socket | undefined;
  private readonly events: Event[] = [];
  private unread = 0;
  private paused = false;
  private wake: (() => void) | undefined;
  private reading = false;
  private ended: SandkilnError | "end" | undefined;
  private closedByUs = false;
  private markClosed!: () => void;
  private readonly forget: () => void;

  /** @internal */
  constructor(port: number, forget: () => void) {
    this.port = port;
    this.forget = forget;
    this.closed = new Promise((r) => (this.markClosed = r));
  }

  /** @internal What the socket's messages and close go to. */
  readonly handlers = {
    message: (data: unknown) => {
      if (typeof data === "string" || this.ended) return; // kiln.tcp's messages are binary
      const bytes = new Uint8Array(data as ArrayBuffer);
      if (bytes.length === 0) return;
      this.push({ kind: "data", bytes });
      this.unread += bytes.length;
      if (this.unread > MAX_UNREAD && this.socket?.pause && !this.paused) {
        // ws's socket stops reading: TCP holds the server back.
        this.paused = true;
        this.socket.pause();
      }
    },
    close: (code: number, reason: string) => {
      this.socket = undefined;
      this.forget();
      if (this.closedByUs || code === 1000) this.push({ kind: "end" });
      else {
        this.push({ kind: "error", err: new SandkilnError("UNAVAILABLE",
          `port ${this.port}: the connection broke off (${code}${reason ? ": " + reason : ""})`) });
      }
      this.markClosed();
    },
  };

  /** @internal */
  opened(socket: Socket): void {
    this.socket = socket;
  }

  private push(e: Event): void {
    if (this.ended) return;
    if (e.kind !== "data") this.ended = e.kind === "end" ? "end" : e.err;
    this.events.push(e);
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  /** The server's bytes, as they come; it ends when the connection closes, and fails (UNAVAILABLE) if it broke. */
  get readable(): AsyncIterable<Uint8Array> {
    return { [Symbol.asyncIterator]: () => this.read() };
  }

  private async *read(): AsyncGenerator<Uint8Array, void, undefined> {
    if (this.reading) throw new SandkilnError("OUTPUT_IN_USE", `port ${this.port}: the connection is being read already`);
    this.reading = true;
    try {
      for (;;) {
        const e = this.events[0];
        if (!e) {
          await new Promise<void>((r) => (this.wake = r));
          continue;
        }
        if (e.kind === "end") return; // left queued: a later read ends too
        if (e.kind === "error") throw e.err;
        this.events.shift();
        this.unread -= e.bytes.length;
        if (this.paused && this.unread <= MAX_UNREAD / 2) {
          this.paused = false;
          this.socket?.resume?.();
        }
        yield e.bytes;
      }
    } finally {
      this.reading = false;
    }
  }

  /**
   * Sends bytes (a string as UTF-8) to the server, in order with earlier
   * writes; it resolves once the runtime holds little unsent (256 KiB).
   * After close() it is DETACHED; on a connection the server closed or
   * that broke, UNAVAILABLE.
   */
  async write(data: Uint8Array | string, options: SignalOptions = {}): Promise<void> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    this.usable();
    for (let i = 0; i < bytes.length; i += MAX_MESSAGE) {
      this.usable().send(bytes.slice(i, i + MAX_MESSAGE));
      await this.drained(options.signal);
    }
  }

  private usable(): Socket {
    if (this.closedByUs) throw new SandkilnError("DETACHED", `port ${this.port}: the connection was closed`);
    if (!this.socket) throw new SandkilnError("UNAVAILABLE", `port ${this.port}: the connection is closed`);
    return this.socket;
  }

  /** Waits while the runtime holds more than MAX_UNSENT unsent; WebSocket has no event for it, so it looks again every few ms. */
  private async drained(signal: AbortSignal | undefined): Promise<void> {
    for (;;) {
      const s = this.socket as (Socket & { bufferedAmount?: number }) | undefined;
      if (!s || (s.bufferedAmount ?? 0) <= MAX_UNSENT) return;
      if (signal?.aborted) throw new SandkilnError("WAIT_ABORTED", `port ${this.port}: write aborted; its bytes may have been sent`, { cause: signal.reason });
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  /** Closes the connection, both ways, and resolves once it is closed; what the server sent and was not read is dropped. */
  async close(): Promise<void> {
    if (!this.closedByUs) {
      this.closedByUs = true;
      this.events.length = 0;
      this.unread = 0;
      this.push({ kind: "end" });
      const s = this.socket;
      if (s) s.close(1000);
      else this.markClosed();
    }
    await this.closed;
  }
}
