// One HTTP call to kilnd: bounded, authenticated, and honest about what a
// failure means (not sent, refused, or sent with its answer lost).

import { SandkilnError } from "./errors.js";

/** How long a control request may take; waits and output have none. */
export const CONTROL_TIMEOUT_MS = 30_000;

/** The most of an error answer read. */
const MAX_ERROR_BODY = 64 << 10;

export interface CallOptions {
  /** A parameter whose value is an array is repeated, a value each. */
  query?: Record<string, string | number | boolean | readonly string[] | undefined>;
  /** A JSON body (any value) or bytes. */
  json?: unknown;
  bytes?: Uint8Array;
  /** A body of any kind (a stream, a Blob, bytes), sent with contentType. */
  body?: BodyInit | Uint8Array | Blob | ReadableStream<Uint8Array>;
  contentType?: string;
  /** A repeated call has the same effect: a lost answer is not an unknown outcome. */
  idempotent?: boolean;
  signal?: AbortSignal | undefined;
  /** No local timeout (waits, downloads); the caller's signal alone ends it. */
  unbounded?: boolean;
  /** The local timeout, when not CONTROL_TIMEOUT_MS: a call kilnd answers later by design (a stop's grace). */
  timeoutMs?: number;
  /** Extra headers. */
  headers?: Record<string, string>;
  /** Which answers are kilnd's errors (default: a status of 300 or more). */
  isError?: (resp: Response) => boolean;
}

/** Where kilnd is and how to prove who we are. */
export class Transport {
  readonly base: string;
  readonly token: string | undefined;

  constructor(base: string, token: string | undefined) {
    this.base = base.replace(/\/+$/, "");
    this.token = token;
  }

  url(path: string, query?: CallOptions["query"]): string {
    let u = this.base + path;
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query ?? {})) {
      if (Array.isArray(v)) for (const item of v) q.append(k, item);
      else if (v !== undefined) q.set(k, String(v));
    }
    const s = q.toString();
    if (s) u += "?" + s;
    return u;
  }

  /** The WebSocket URL of path, and the subprotocols to offer. */
  socket(path: string, query: CallOptions["query"], protocol: string): { url: string; protocols: string[] } {
    const url = this.url(path, query).replace(/^http/, "ws");
    const protocols = [protocol];
    if (this.token) protocols.push("kiln.token." + this.token);
    return { url, protocols };
  }

  /**
   * Makes one request and returns the answer when its status is below 300;
   * any other answer is kilnd's error. A failure after dispatch is
   * OUTCOME_UNKNOWN unless the call is idempotent.
   */
  async fetch(method: string, path: string, o: CallOptions = {}): Promise<Response> {
    const what = `${method} ${path}`;
    if (o.signal?.aborted) {
      throw new SandkilnError("WAIT_ABORTED", `${what}: aborted before it was sent`, { cause: o.signal.reason });
    }
    const signals: AbortSignal[] = [];
    if (o.signal) signals.push(o.signal);
    const timeout = o.unbounded ? undefined : AbortSignal.timeout(o.timeoutMs ?? CONTROL_TIMEOUT_MS);
    if (timeout) signals.push(timeout);
    const headers: Record<string, string> = { ...o.headers };
    if (this.token) headers["Authorization"] = "Bearer " + this.token;
    let body: BodyInit | undefined;
    if (o.json !== undefined) {
      body = JSON.stringify(o.json);
      headers["Content-Type"] = "application/json";
    } else if (o.bytes !== undefined) {
      body = o.bytes as unknown as BodyInit;
      headers["Content-Type"] = "application/octet-stream";
    } else if (o.body !== undefined) {
      body = o.body as unknown as BodyInit;
      if (o.contentType) headers["Content-Type"] = o.contentType;
    }
    // A stream is sent as it is read: fetch needs to be told (Node's refuses it otherwise).
    const streamed = typeof ReadableStream !== "undefined" && o.body instanceof ReadableStream;
    let resp: Response;
    try {
      resp = await fetch(this.url(path, o.query), {
        method,
        headers,
        body,
        redirect: "manual",
        signal: signals.length > 0 ? AbortSignal.any(signals) : null,
        ...(o.idempotent ? {} : sentOnce()),
        ...(streamed ? { duplex: "half" } : {}),
      } as RequestInit);
    } catch (err) {
      throw this.lost(what, err, o, timeout);
    }
    if (o.isError ? o.isError(resp) : resp.status >= 300) {
      throw SandkilnError.fromAnswer(resp.status, await errorBody(resp), what);
    }
    return resp;
  }

  /** Makes a request and decodes its JSON answer (none for 204). */
  async call<T>(method: string, path: string, o: CallOptions = {}): Promise<T> {
    const resp = await this.fetch(method, path, o);
    if (resp.status === 204) return undefined as T;
    try {
      return (await resp.json()) as T;
    } catch (err) {
      throw this.lost(`${method} ${path}: reading the answer`, err, o, undefined);
    }
  }

  /** What a request that failed without an answer means. */
  private lost(what: string, err: unknown, o: CallOptions, timeout: AbortSignal | undefined): SandkilnError {
    const refused = connectionRefused(err);
    if (o.signal?.aborted) {
      return new SandkilnError(o.idempotent || refused ? "WAIT_ABORTED" : "OUTCOME_UNKNOWN", `${what}: aborted`, {
        cause: o.signal.reason,
      });
    }
    if (!o.idempotent && !refused) {
      const why = timeout?.aborted ? `no answer within ${(o.timeoutMs ?? CONTROL_TIMEOUT_MS) / 1000} s` : "the answer was lost";
      return new SandkilnError("OUTCOME_UNKNOWN", `${what}: ${why}; it may or may not have taken effect`, { cause: err });
    }
    return new SandkilnError("UNAVAILABLE", `${what}: kilnd at ${this.base} did not answer: ${message(err)}`, { cause: err });
  }
}

/**
 * What keeps the runtime from sending a request again by itself. Bun and
 * Deno send a request again when the pooled connection it went on closes
 * before the answer (Bun for idempotent methods, DELETE among them; Deno
 * for any): a lost answer would then become a second terminate, or a
 * second start. A request the SDK promises to send once goes on a
 * connection of its own: Bun's keepalive false, Deno's client that keeps
 * none idle. Elsewhere keepalive false is fetch's default, and Node does
 * not send again.
 */
function sentOnce(): RequestInit {
  const deno = (globalThis as { Deno?: { createHttpClient?: (o: { poolMaxIdlePerHost: number }) => unknown } }).Deno;
  if (deno?.createHttpClient) {
    unpooled ??= deno.createHttpClient({ poolMaxIdlePerHost: 0 });
    return { client: unpooled } as RequestInit;
  }
  return { keepalive: false };
}

let unpooled: unknown;

async function errorBody(resp: Response): Promise<unknown> {
  try {
    const text = await resp.text();
    return JSON.parse(text.slice(0, MAX_ERROR_BODY));
  } catch {
    return null;
  }
}

/** Says the connection was never made: nothing was sent. */
function connectionRefused(err: unknown): boolean {
  const e = err as { code?: unknown; cause?: { code?: unknown } } | null;
  const code = e?.cause?.code ?? e?.code; // Node's fetch has it in the cause, Bun's on the error
  if (code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EAI_AGAIN" || code === "ConnectionRefused") return true;
  // Deno's says it in words alone: "tcp connect error: Connection refused".
  const cause = (e?.cause as { message?: unknown } | undefined)?.message;
  return typeof cause === "string" && /\btcp connect error\b|\bdns error\b/.test(cause);
}

export function message(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    return cause instanceof Error ? `${err.message}: ${cause.message}` : err.message;
  }
  return String(err);
}
