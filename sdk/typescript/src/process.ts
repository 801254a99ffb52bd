// A handle on one process: its output (replay, then live, resumed from
// offsets, at the pace its reader reads), its input (in order, each write
// once), its exit (confirmed, never guessed) and its control.

import { SandkilnError } from "./errors.js";
import { message, type Transport } from "./http.js";
import { checkOptions, checkSignal, noMore, SIGNAL_ONLY } from "./options.js";
import { openSocket, type Socket } from "./socket.js";
import { encodeUTF8, StreamDecoder } from "./utf8.js";
import type { components } from "./wire.js";

type WireExit = components["schemas"]["Exit"];
type WireProcess = components["schemas"]["Process"];

/** The output streams: stdout and stderr, or a terminal's one. */
export type StreamName = "stdout" | "stderr" | "terminal";

/** Output as text: one streaming UTF-8 decoder per stream. */
export interface TextChunk {
  stream: StreamName;
  text: string;
  /** Where the chunk's bytes begin in the stream. */
  offset: number;
  /** Bytes the process had written on all its streams before this chunk. */
  seq: number;
  /** Non-zero (overflow "report" only): a gap, not output. That many bytes of the stream, before offset, were lost to this handle. */
  lost: number;
}

/** Output as the exact bytes. */
export interface ByteChunk {
  stream: StreamName;
  bytes: Uint8Array;
  offset: number;
  seq: number;
  lost: number;
}

export type Chunk = TextChunk | ByteChunk;

/** How a process ended. */
export interface Exit {
  /** The exit code: the process's own, or 128 plus the signal's number when a signal ended it (137 for SIGKILL), as the shell and Docker have it. */
  exitCode: number;
  /** The signal that ended it ("SIGKILL"), or null. */
  signal: string | null;
  /** The kernel's out-of-memory killer ended it. */
  oomKilled: boolean;
  /**
   * Why the output did not end by itself, or null: "drain_timeout", when
   * something the process left behind held its output open past the
   * drain time after its exit (start option drainMs) and the output was
   * cut there. Known once this handle read the output to its end.
   */
  outputCut: string | null;
}

/** What a handle's output accounted for of one stream. */
export interface StreamCount {
  /** Bytes up to where the output stands: delivered or lost. */
  bytes: number;
  lostBytes: number;
  ended: boolean;
}

/** A confirmed exit, and how complete this handle's output is. */
export interface WaitResult extends Exit {
  /** True only when the output reached every stream's end with no gap and was not cut. A wait that returns before the output drained says false; a later one can say true. */
  outputComplete: boolean;
  streams: Record<string, StreamCount>;
}

export interface ProcessStatus {
  state: "running" | "exited" | "unknown";
  exit?: Exit;
  observedAt: Date;
  /** Why the state is unknown, when it is. */
  error?: SandkilnError;
}

export interface TerminateResult {
  status: "requested" | "not-found" | "exited";
}

export interface SignalOptions {
  signal?: AbortSignal;
}

/** What reopen needs to return to a process. Keep it private: it names the process and where this handle's output stood. */
export interface ProcessReference {
  kind: "process" | "terminal";
  version: 1;
  sandbox: string;
  process: string;
  /** Where the output stands, per stream: a reopened handle resumes there. */
  offsets: Record<string, number>;
  /** Bytes reported lost to this handle, per stream. */
  lost: Record<string, number>;
  ended: Record<string, boolean>;
  stdin: { pipe: boolean; offset: number; closed: boolean };
  format: "text" | "bytes";
  mode: "stream" | "finite";
  maxOutputBytes: number;
  overflow: "fail" | "report";
  hold: boolean;
  expiresAt: string;
}

/** Bounds of the seed's contract. */
export const LIMITS = {
  /** One delivered chunk. */
  maxChunkBytes: 16 << 10,
  /** The unread output queue. */
  maxQueuedBytes: 64 << 10,
  maxQueuedChunks: 256,
  /**
   * What may have arrived past the unread queue, held apart until the
   * consumer makes room: one frame of kilnd's at its largest (the seed's
   * one bounded incoming frame). The queue and this bound the output the
   * SDK holds for a connection.
   */
  maxReadAheadBytes: 256 << 10,
  /** One write. */
  maxWriteBytes: 64 << 10,
  /** The input queue, the write in progress included. */
  maxInputBytes: 256 << 10,
  maxInputCalls: 256,
  /** Finite mode's output. */
  maxFiniteOutput: 1 << 20,
  /** A reference's life. */
  referenceLifetimeMs: 24 * 60 * 60 * 1000,
} as const;

/**
 * What a frame costs of the credit at least (the protocol's rule: its
 * payload or this, whichever is more), so that the unread queue's bound in
 * credit holds its bytes and its chunks alike (64 KiB / 256 = 256 bytes).
 */
const CREDIT_FRAME = LIMITS.maxQueuedBytes / LIMITS.maxQueuedChunks;

/**
 * The credit an output connection grants kilnd: the unread queue's bound,
 * and one frame more on its way (LIMITS.maxReadAheadBytes, the seed's "one
 * bounded incoming frame" a transport may take before the queue is
 * checked), held apart until the consumer makes room in the queue. The
 * queue itself never holds more than its bound, and the SDK never more
 * than this. A frame's worth in flight beyond the queue keeps a fast
 * reader from waiting a round trip for its credit, and lets credit go back
 * in few messages.
 */
const WINDOW = LIMITS.maxQueuedBytes + LIMITS.maxReadAheadBytes;

/**
 * Credit goes back to kilnd once this much was read, so that the rest of
 * the window (192 KiB) is on its way while the grant travels. Each credit
 * is a socket write that wakes kilnd, and one at every 64 KiB read was
 * the largest item of Node 22's profile of a fast burst (a fifth of its
 * time); half as many let kilnd send larger frames too. Every grant also
 * acks (a holding handle's offsets), within the protocol's 256 KiB. kilnd
 * is never left without credit for a frame while the queue is empty: the
 * window less this is more than a frame costs.
 */
const GRANT_EVERY = 128 << 10;

/** The size of a kiln.v1 frame's header. */
const FRAME_HEADER = 17;

const STREAMS: Record<number, StreamName> = { 1: "stdout", 2: "stderr", 3: "terminal" };

export interface HandleSettings {
  format: "text" | "bytes";
  mode: "stream" | "finite";
  maxOutputBytes: number;
  overflow: "fail" | "report";
  hold: boolean;
  terminal: boolean;
  stdinPipe: boolean;
}

/** The sandbox a handle belongs to, as the handle needs it. */
export interface HandleOwner {
  readonly id: string;
  readonly transport: Transport;
  /** Forgets a handle that was detached. */
  release(h: Handle<Chunk>): void;
}

/** One chunk on its way, with where its stream stands once delivered. */
interface Pending {
  chunk: Chunk;
  /** Where the stream stands once it is delivered (bytes of a character held back excluded). */
  next: number;
  end: boolean;
  /** Nothing to show: only the end to record. */
  silent: boolean;
  size: number;
  /** What its frame cost of the credit (the first piece of a frame carries it all). */
  cost: number;
}

type Item =
  | { kind: "chunk"; p: Pending }
  | { kind: "end" } // the exit came: the output is whole
  | { kind: "closed"; code: number; reason: string }
  | { kind: "error"; err: SandkilnError };

/**
 * The items of one output connection, in order, for the one consumer: the
 * unread queue, within its bounds (64 KiB of credit, so 256 chunks at
 * most), and behind it what arrived past them, held apart until the
 * consumer makes room.
 */
class Queue {
  private items: Item[] = [];
  private arriving: Item[] = [];
  /** The connection was let go: its later messages are not queued. */
  stopped = false;
  private wake: (() => void) | undefined;
  /** Chunks in the queue, and the credit their frames cost. */
  chunks = 0;
  cost = 0;
  /** The credit of what arrived past the queue's bounds. */
  held = 0;

  push(it: Item): void {
    if (this.arriving.length > 0 || (it.kind === "chunk" && this.cost + it.p.cost > LIMITS.maxQueuedBytes)) {
      this.arriving.push(it);
      if (it.kind === "chunk") this.held += it.p.cost;
      return;
    }
    this.enqueue(it);
  }

  private enqueue(it: Item): void {
    if (it.kind === "chunk") {
      this.cost += it.p.cost;
      if (this.merge(it.p)) return;
      this.chunks++;
    }
    this.items.push(it);
    this.wake?.();
  }

  /**
   * Joins p to the last chunk queued when it continues it (the same
   * stream, its next bytes, output both) and the two fit in one chunk:
   * fewer, larger chunks for a reader that is behind. Nothing is
   * reordered: only the last chunk grows, and the consumer has not seen it.
   */
  private merge(p: Pending): boolean {
    const last = this.items.at(-1);
    if (last?.kind !== "chunk") return false;
    const a = last.p;
    if (a.end || p.end || a.chunk.lost || p.chunk.lost || a.chunk.stream !== p.chunk.stream) return false;
    if (a.chunk.offset + a.size !== p.chunk.offset || a.size + p.size > LIMITS.maxChunkBytes) return false;
    if ("text" in a.chunk && "text" in p.chunk) a.chunk.text += p.chunk.text;
    else if ("bytes" in a.chunk && "bytes" in p.chunk) {
      const b = new Uint8Array(a.size + p.size);
      b.set(a.chunk.bytes);
      b.set(p.chunk.bytes, a.size);
      a.chunk.bytes = b;
    } else return false;
    a.size += p.size;
    a.cost += p.cost;
    a.next = p.next;
    a.silent = false;
    this.wake?.();
    return true;
  }

  async take(signal: AbortSignal): Promise<Item> {
    while (this.items.length === 0) {
      if (signal.aborted) throw abortedWait("output", signal);
      await new Promise<void>((resolve) => {
        const done = () => {
          this.wake = undefined;
          signal.removeEventListener("abort", done);
          resolve();
        };
        this.wake = done;
        signal.addEventListener("abort", done, { once: true });
      });
    }
    const it = this.items.shift()!;
    if (it.kind === "chunk") {
      this.cost -= it.p.cost;
      this.chunks--;
    }
    // What waited behind the queue's bounds comes in as room is made.
    while (this.arriving.length > 0) {
      const next = this.arriving[0]!;
      if (next.kind === "chunk" && this.cost + next.p.cost > LIMITS.maxQueuedBytes) break;
      this.arriving.shift();
      if (next.kind === "chunk") this.held -= next.p.cost;
      this.enqueue(next);
    }
    return it;
  }

  clear(): void {
    this.items = [];
    this.arriving = [];
    this.chunks = this.cost = this.held = 0;
    this.wake?.();
  }
}

function abortedWait(what: string, signal: AbortSignal): SandkilnError {
  return new SandkilnError("WAIT_ABORTED", `${what}: aborted`, { cause: signal.reason });
}

/** Linux's signal numbers, for an exit an older kilnd described by its signal alone. */
const SIGNALS: Record<string, number> = {
  HUP: 1, INT: 2, QUIT: 3, ILL: 4, TRAP: 5, ABRT: 6, BUS: 7, FPE: 8, KILL: 9, USR1: 10, SEGV: 11, USR2: 12, PIPE: 13,
  ALRM: 14, TERM: 15, STKFLT: 16, CHLD: 17, CONT: 18, STOP: 19, TSTP: 20, TTIN: 21, TTOU: 22, URG: 23, XCPU: 24,
  XFSZ: 25, VTALRM: 26, PROF: 27, WINCH: 28, IO: 29, PWR: 30, SYS: 31,
};

/** kilnd names signals as kill -l does ("KILL"); the SDK as the seed does ("SIGKILL"). */
export function exitOf(e: WireExit): Exit {
  const name = e.signal ? e.signal.replace(/^SIG/, "") : null;
  const code = e.exit_code ?? (name && SIGNALS[name] !== undefined ? 128 + SIGNALS[name]! : -1);
  return { exitCode: code, signal: name ? "SIG" + name : null, oomKilled: e.oom_killed ?? false, outputCut: e.output_cut ?? null };
}

/**
 * What processes and terminals have in common. Its methods may be called
 * concurrently; its output has one consumer at a time.
 */
export abstract class Handle<C extends Chunk> {
  /** The process's id in its sandbox. */
  readonly id: string;
  protected readonly owner: HandleOwner;
  protected readonly settings: HandleSettings;

  private offsets: Record<string, number> = {};
  private lostBy: Record<string, number> = {};
  private ended: Record<string, boolean> = {};
  private exit: Exit | undefined;
  private delivered = 0; // bytes given out, for finite mode's bound
  private gone = false;
  /** Aborted when the handle goes away: every call still waiting settles. */
  private readonly life = new AbortController();
  private reading = false;
  /** The output may be held for this handle: a release is owed when it stops reading. */
  private holding: boolean;
  private socket: Socket | undefined;
  private queue: Queue | undefined;
  private references: ProcessReference[] = [];

  // Input: writes go one after another, each at the offset the last left.
  private stdinOffset = 0;
  private stdinClosed = false;
  private closing: Promise<void> | undefined;
  private uncertain: SandkilnError | undefined;
  private inputTail: Promise<unknown> = Promise.resolve();
  private inputBytes = 0;
  private inputCalls = 0;

  private terminating: Promise<TerminateResult> | undefined;
  private terminateError: SandkilnError | undefined;

  /** @internal */
  constructor(owner: HandleOwner, id: string, settings: HandleSettings, ref?: ProcessReference) {
    this.owner = owner;
    this.id = id;
    this.settings = settings;
    this.holding = settings.hold;
    if (ref) {
      this.offsets = { ...ref.offsets };
      this.lostBy = { ...ref.lost };
      this.ended = { ...ref.ended };
      this.stdinOffset = ref.stdin.offset;
      this.stdinClosed = ref.stdin.closed;
    }
  }

  private get streams(): StreamName[] {
    return this.settings.terminal ? ["terminal"] : ["stdout", "stderr"];
  }

  private path(rest = ""): string {
    return `/sandboxes/${encodeURIComponent(this.owner.id)}/exec-stream/${encodeURIComponent(this.id)}${rest}`;
  }

  /** True when bytes were lost to this handle (a gap); lostBytes says how many. */
  get outputGap(): boolean {
    return this.lostBytes > 0;
  }

  /** Bytes reported lost to this handle, all streams together. */
  get lostBytes(): number {
    return Object.values(this.lostBy).reduce((a, b) => a + b, 0);
  }

  /**
   * The output, replay then live, from where this handle stands (the
   * beginning, or where a reopened handle's reference stood), until every
   * stream ended. kilnd sends no more than the unread queue holds (64 KiB,
   * 256 chunks) and more as the consumer reads: a consumer that keeps up
   * gets every byte, and one that falls behind holds kilnd back, never
   * the queue over its bound. A process this handle started holds its
   * output for it (it waits for its reader, as a terminal's program does);
   * one it did not start may lose what kilnd cannot keep while the
   * consumer is behind: then, by default (output.overflow "fail"), the
   * output fails with OUTPUT_CAPACITY, saying how many bytes; with
   * "report", a chunk with lost set and no output says so, and the output
   * goes on.
   *
   * If the connection breaks, the iterator fails with UNAVAILABLE, and
   * calling output() again resumes from the last chunk delivered, nothing
   * repeated. In finite mode leaving the loop detaches the handle; in
   * stream mode it only stops reading, and the process no longer waits
   * for this handle. Its return() ends it even while it waits for output.
   */
  protected outputChunks(options: SignalOptions, extra: readonly unknown[]): AsyncGenerator<C, void, undefined> {
    // A generator's return() waits for its pending next(), which for a
    // quiet process is forever: this one first wakes that wait.
    const stop = new AbortController();
    const gen = this.read(options, extra, stop.signal);
    const end = gen.return.bind(gen);
    gen.return = (v) => {
      stop.abort();
      return end(v);
    };
    return gen;
  }

  private async *read(options: SignalOptions, extra: readonly unknown[], stop: AbortSignal): AsyncGenerator<C, void, undefined> {
    noMore(extra, "output()");
    const { signal: caller } = checkOptions(options, SIGNAL_ONLY, "output()");
    checkSignal(caller, "output()");
    if (this.gone) throw this.detachedError();
    if (this.reading) throw new SandkilnError("OUTPUT_IN_USE", `process ${this.id}: its output has a consumer already`);
    this.reading = true;
    const signal = AbortSignal.any(caller ? [caller, stop] : [stop]);
    let whole = false; // the output came to its end
    let broken = false; // the connection broke: a later output() resumes where this stopped
    try {
      const q = await this.connect(signal);
      let ungranted = 0;
      for (;;) {
        const it = await q.take(signal);
        if (it.kind === "error") throw it.err;
        if (it.kind === "end") {
          whole = true;
          return;
        }
        if (it.kind === "closed") {
          if (this.gone) throw this.detachedError();
          broken = true;
          throw new SandkilnError("UNAVAILABLE",
            `process ${this.id}: output interrupted (${it.code}${it.reason ? " " + it.reason : ""}); call output() again to resume`);
        }
        const p = it.p;
        this.deliver(p);
        ungranted += p.cost;
        if (ungranted >= GRANT_EVERY) {
          this.grant(ungranted);
          ungranted = 0;
        }
        if (p.chunk.lost && this.settings.overflow === "fail") {
          throw new SandkilnError("OUTPUT_CAPACITY",
            `process ${this.id}: ${p.chunk.lost} bytes of ${p.chunk.stream} were lost before this handle read them ` +
            `(the reader fell behind what kilnd keeps); output.overflow "report" goes on past such gaps`);
        }
        if (p.silent) continue;
        yield p.chunk as C;
        if (this.gone) throw this.detachedError();
      }
    } catch (err) {
      if (err instanceof SandkilnError && err.code === "UNAVAILABLE") broken = true;
      throw err;
    } finally {
      this.reading = false;
      // A consumer that stopped (a break, an abort, a failure) is not
      // read for any more: the process must not wait for it. One whose
      // connection broke may come back (within kilnd's grace) and find
      // the output it held still there.
      if (!whole && !broken) this.release();
      this.hangUp();
      if (this.settings.mode === "finite") await this.detach();
    }
  }

  /** Opens an output connection from where the handle stands; its messages go to a new queue. */
  private async connect(signal: AbortSignal): Promise<Queue> {
    this.hangUp();
    const query: Record<string, number | string> = { credit: WINDOW };
    for (const s of this.streams) if (this.offsets[s]) query[s] = this.offsets[s]!;
    if (this.settings.hold) Object.assign(query, { flow: "block", ack: "true" });
    const { url, protocols } = this.owner.transport.socket(this.path("/logs"), query, "kiln.v1");
    const q = new Queue();
    this.queue = q;
    // Where each stream stands once what is queued is delivered.
    const at: Record<string, number> = { ...this.offsets };
    const decoders: Record<string, StreamDecoder> = {};
    const decoder = (s: string) => (decoders[s] ??= new StreamDecoder());
    const pos = (s: string) => (at[s] ?? 0) + (this.settings.format === "text" ? decoder(s).held : 0);
    const put = (p: Pending) => {
      at[p.chunk.stream] = Math.max(at[p.chunk.stream] ?? 0, p.next);
      q.push({ kind: "chunk", p });
    };
    const gap = (stream: StreamName, from: number, to: number) => {
      // What the decoder held of a cut character first, then the gap.
      if (this.settings.format === "text" && decoder(stream).held > 0) {
        const text = decoder(stream).flush();
        put(this.pending(stream, from, 0, text, new Uint8Array(0), from, 0, false, 0));
      }
      put(this.pending(stream, to, 0, "", new Uint8Array(0), to, to - from, false, 0));
    };
    let finiteLeft = this.settings.mode === "finite" ? this.settings.maxOutputBytes - this.delivered : Infinity;
    const onMessage = (data: unknown) => {
      if (typeof data === "string") {
        let m: { type?: string; stream?: StreamName; from?: number; to?: number; total_bytes?: number } & WireExit;
        try {
          m = JSON.parse(data);
        } catch {
          return;
        }
        switch (m.type) {
          case "gap":
            if (m.stream && m.to !== undefined) gap(m.stream, Math.max(m.from ?? 0, pos(m.stream)), m.to);
            break;
          case "end": {
            if (!m.stream || m.total_bytes === undefined) break;
            if (m.total_bytes > pos(m.stream)) gap(m.stream, pos(m.stream), m.total_bytes);
            const text = this.settings.format === "text" ? decoder(m.stream).flush() : "";
            put(this.pending(m.stream, m.total_bytes, 0, text, new Uint8Array(0), m.total_bytes, 0, true, 0));
            break;
          }
          case "exit":
            // Last, after every stream's end: the output is whole without
            // waiting for the close (a network can hold that back).
            this.exit = exitOf(m);
            q.push({ kind: "end" });
            q.stopped = true;
            break;
        }
        return;
      }
      // A view lent for this call alone (handlers.borrow): putPieces copies what is kept.
      const b = data instanceof Uint8Array ? data : new Uint8Array(data as ArrayBuffer);
      if (b.length < FRAME_HEADER) return;
      const stream = STREAMS[b[0]!];
      if (!stream) return;
      const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
      const offset = Number(view.getBigUint64(1));
      const seq = Number(view.getBigUint64(9));
      if (offset > pos(stream)) gap(stream, pos(stream), offset); // a jump kilnd did not explain is reported all the same
      let payload = b.subarray(FRAME_HEADER);
      const cost = Math.max(payload.length, CREDIT_FRAME);
      if (payload.length > finiteLeft) {
        payload = payload.subarray(0, finiteLeft);
        finiteLeft = 0;
        this.putPieces(stream, offset, seq, payload, cost, decoder, put);
        this.stop(q, new SandkilnError("OUTPUT_CAPACITY",
          `process ${this.id}: finite output is at most ${this.settings.maxOutputBytes} bytes; start it with output: { mode: "stream" } for more`));
        return;
      }
      finiteLeft -= payload.length;
      this.putPieces(stream, offset, seq, payload, cost, decoder, put);
      if (q.cost + q.held > WINDOW) {
        // kilnd sends only what was granted: this is not kilnd speaking.
        this.stop(q, new SandkilnError("INTERNAL", `process ${this.id}: kilnd sent ${q.cost + q.held} bytes of output with ${WINDOW} granted`));
      }
    };
    let socket: Socket | undefined;
    const handlers = {
      borrow: true,
      message: (data: unknown) => {
        if (this.queue === q && !q.stopped) onMessage(data);
      },
      close: (code: number, reason: string) => {
        if (this.socket === socket) this.socket = undefined;
        if (!q.stopped) q.push({ kind: "closed", code, reason });
      },
    };
    try {
      socket = await openSocket(url, protocols, handlers, signal);
    } catch (err) {
      q.stopped = true;
      if (signal.aborted) throw abortedWait("output", signal);
      throw await this.whyNotOpen(err);
    }
    if (this.gone) {
      q.stopped = true;
      socket.close(1000);
      throw this.detachedError();
    }
    this.socket = socket;
    if (this.settings.hold) this.holding = true;
    return q;
  }

  /**
   * Queues a frame's data in chunks of at most 16 KiB, each costing its
   * length of the frame's credit, the first what the frame cost beyond its
   * length too: no chunk costs more than the queue can take at once.
   */
  private putPieces(stream: StreamName, offset: number, seq: number, data: Uint8Array, cost: number,
    decoder: (s: string) => StreamDecoder, put: (p: Pending) => void): void {
    if (data.length === 0) {
      put(this.pending(stream, offset, seq, "", new Uint8Array(0), offset - (this.settings.format === "text" ? decoder(stream).held : 0), 0, false, cost));
      return;
    }
    for (let i = 0; i < data.length; i += LIMITS.maxChunkBytes) {
      const piece = data.subarray(i, i + LIMITS.maxChunkBytes);
      const end = offset + i + piece.length;
      const c = piece.length + (i === 0 ? cost - data.length : 0);
      if (this.settings.format === "text") {
        const d = decoder(stream);
        const text = d.decode(piece);
        put(this.pending(stream, offset + i, seq + i, text, piece, end - d.held, 0, false, c));
      } else {
        put(this.pending(stream, offset + i, seq + i, "", piece.slice(), end, 0, false, c));
      }
    }
  }

  private pending(stream: StreamName, offset: number, seq: number, text: string, bytes: Uint8Array,
    next: number, lost: number, end: boolean, cost: number): Pending {
    const chunk: Chunk = this.settings.format === "text"
      ? { stream, text, offset, seq, lost }
      : { stream, bytes: lost > 0 || end ? new Uint8Array(0) : bytes, offset, seq, lost };
    const silent = lost === 0 && (this.settings.format === "text" ? text === "" : bytes.length === 0 || end);
    return { chunk, next, end, silent, size: lost > 0 ? 0 : bytes.length, cost };
  }

  /** Gives kilnd back the credit of what the consumer took; a holding handle acks where it stands with it. */
  private grant(bytes: number): void {
    this.send(this.settings.hold ? { type: "credit", bytes, offsets: this.offsets } : { type: "credit", bytes });
  }

  private send(m: object): void {
    try {
      this.socket?.send(JSON.stringify(m));
    } catch {
      // A socket closing: its close says the rest.
    }
  }

  /**
   * Lets go of the output held for this handle (a process it started, or
   * whose output it held): the process no longer waits for it. On the
   * output connection when there is one, else by a request of its own,
   * whose failure costs only kilnd's grace period of waiting.
   */
  private release(): void {
    if (!this.holding) return;
    this.holding = false;
    if (this.socket) {
      this.send({ type: "release" });
      return;
    }
    this.owner.transport.call("POST", this.path("/release"), { idempotent: true }).catch(() => undefined);
  }

  /** Lets the connection go: its queue ends with err. */
  private stop(q: Queue, err: SandkilnError): void {
    q.stopped = true; // what comes after is not this queue's
    q.push({ kind: "error", err });
  }

  private hangUp(): void {
    const s = this.socket;
    this.socket = undefined;
    s?.close(1000);
  }

  /** Why an output connection did not open: a browser says nothing, so kilnd is asked. */
  private async whyNotOpen(err: unknown): Promise<SandkilnError> {
    try {
      await this.owner.transport.call<WireProcess>("GET", this.path(), { idempotent: true });
    } catch (e) {
      if (e instanceof SandkilnError && e.status !== undefined) return e;
    }
    return new SandkilnError("UNAVAILABLE", `process ${this.id}: output: ${message(err)}; call output() again to resume`, { cause: err });
  }

  private deliver(p: Pending): void {
    const s = p.chunk.stream;
    this.offsets[s] = Math.max(this.offsets[s] ?? 0, p.next);
    if (p.chunk.lost) this.lostBy[s] = (this.lostBy[s] ?? 0) + p.chunk.lost;
    if (p.end) this.ended[s] = true;
    this.delivered += p.size;
    for (const r of this.references) this.fillReference(r);
  }

  private complete(): boolean {
    return this.lostBytes === 0 && this.streams.every((s) => this.ended[s]) && !this.exit?.outputCut;
  }

  /**
   * Races p against the caller's signal (WAIT_ABORTED: only this call
   * stops waiting) and the handle's life (DETACHED: the handle went).
   */
  private settle<T>(p: Promise<T>, signal: AbortSignal | undefined, what: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const onAbort = () => reject(abortedWait(what, signal!));
      const onGone = () => reject(this.detachedError());
      signal?.addEventListener("abort", onAbort, { once: true });
      this.life.signal.addEventListener("abort", onGone, { once: true });
      const done = () => {
        signal?.removeEventListener("abort", onAbort);
        this.life.signal.removeEventListener("abort", onGone);
      };
      p.then((v) => {
        done();
        resolve(v);
      }, (e) => {
        done();
        reject(e);
      });
    });
  }

  /** A signal that aborts with the caller's, or when the handle goes. */
  private lifeAnd(signal: AbortSignal | undefined): AbortSignal {
    return signal ? AbortSignal.any([signal, this.life.signal]) : this.life.signal;
  }

  /**
   * Waits for a confirmed exit. It has no timeout of its own: abort the
   * signal to stop waiting (WAIT_ABORTED), which cancels only this wait.
   * A connection that breaks fails the wait (UNAVAILABLE); it never
   * guesses an exit. An exit already confirmed (by an earlier wait, a
   * status, or the output's end) is given without asking again, even
   * after the handle was detached: a later output error or a broken
   * connection does not erase it. A wait still pending when the handle
   * goes (detach, disconnect, client.close(), a finite output's end)
   * fails with DETACHED. While nothing reads the output, the process no
   * longer waits for this handle's reader: start reading before waiting.
   */
  async wait(options: SignalOptions = {}, ...extra: never[]): Promise<WaitResult> {
    noMore(extra, "wait()");
    const { signal } = checkOptions(options, SIGNAL_ONLY, "wait()");
    checkSignal(signal, "wait()");
    if (!this.exit) {
      if (this.gone) throw this.detachedError();
      if (!this.reading) this.release();
      const e = await this.settle(this.owner.transport.call<WireExit>("GET", this.path("/wait"), {
        idempotent: true, unbounded: true, signal: this.lifeAnd(signal),
      }), signal, "wait");
      this.exit ??= exitOf(e);
    }
    const streams: Record<string, StreamCount> = {};
    for (const s of this.streams) {
      streams[s] = { bytes: this.offsets[s] ?? 0, lostBytes: this.lostBy[s] ?? 0, ended: this.ended[s] ?? false };
    }
    return { ...this.exit, outputComplete: this.complete(), streams };
  }

  /**
   * What is known of the process now, without its output. Unknown when
   * kilnd cannot say (the error says why); an exit already confirmed stays.
   */
  async status(options: SignalOptions = {}, ...extra: never[]): Promise<ProcessStatus> {
    noMore(extra, "status()");
    const { signal } = checkOptions(options, SIGNAL_ONLY, "status()");
    checkSignal(signal, "status()");
    if (this.gone) throw this.detachedError();
    try {
      const p = await this.settle(this.owner.transport.call<WireProcess>("GET", this.path(), { idempotent: true, signal: this.lifeAnd(signal) }), signal, "status");
      if (p.state === "exited") {
        this.exit = { ...exitOf(p), outputCut: this.exit?.outputCut ?? p.output_cut ?? null };
        return { state: "exited", exit: this.exit, observedAt: new Date() };
      }
      return { state: "running", observedAt: new Date() };
    } catch (err) {
      if (err instanceof SandkilnError && (err.code === "WAIT_ABORTED" || err.code === "DETACHED")) throw err;
      const error = err instanceof SandkilnError ? err : new SandkilnError("UNAVAILABLE", message(err), { cause: err });
      if (this.exit) return { state: "exited", exit: this.exit, observedAt: new Date(), error };
      return { state: "unknown", observedAt: new Date(), error };
    }
  }

  /** Sends a signal ("SIGTERM", "SIGINT", "9") to the process's group. A process may ignore it: wait() confirms the exit. */
  async signal(name: string, options: SignalOptions = {}, ...extra: never[]): Promise<void> {
    noMore(extra, "signal()");
    const { signal } = checkOptions(options, SIGNAL_ONLY, "signal()");
    if (typeof name !== "string" || name === "") throw new SandkilnError("INVALID_ARGUMENT", "signal(): a signal's name or number is needed");
    checkSignal(signal, "signal()");
    if (this.gone) throw this.detachedError();
    await this.settle(this.owner.transport.call("POST", this.path("/signal"), { json: { signal: name }, signal }), signal, "signal");
  }

  /**
   * Asks for the process group to be killed (SIGKILL). Success does not
   * prove the exit: call wait(). Concurrent callers share one request, an
   * abort stopping only its caller's wait; if the answer is lost, this
   * and every later call fail with the same OUTCOME_UNKNOWN, nothing sent
   * again. A signal already aborted sends nothing.
   */
  terminate(options: SignalOptions = {}, ...extra: never[]): Promise<TerminateResult> {
    let signal: AbortSignal | undefined;
    try {
      noMore(extra, "terminate()");
      ({ signal } = checkOptions(options, SIGNAL_ONLY, "terminate()"));
      checkSignal(signal, "terminate()");
    } catch (err) {
      return Promise.reject(err);
    }
    if (this.gone) return Promise.reject(this.detachedError());
    if (this.terminateError) return Promise.reject(this.terminateError);
    this.terminating ??= (async (): Promise<TerminateResult> => {
      try {
        const p = await this.owner.transport.call<WireProcess>("DELETE", this.path());
        if (p.state === "exited") this.exit ??= exitOf(p);
        return { status: p.state === "exited" ? "exited" : "requested" };
      } catch (err) {
        if (err instanceof SandkilnError && err.code === "NOT_FOUND") return { status: "not-found" };
        if (err instanceof SandkilnError && err.code === "OUTCOME_UNKNOWN") this.terminateError = err;
        throw err;
      } finally {
        this.terminating = undefined;
      }
    })();
    return this.settle(this.terminating, signal, "terminate");
  }

  /**
   * Sends data to the process's input after every earlier write: a
   * string as UTF-8, bytes exactly. At most 64 KiB a write, and 256 KiB
   * and 256 calls queued. Success means kilnd accepted it, not that the
   * program read it. If the answer is lost, delivery is unknown and input
   * is disabled (INPUT_UNCERTAIN); nothing is sent twice.
   */
  async write(data: string | Uint8Array, options: SignalOptions = {}, ...extra: never[]): Promise<void> {
    noMore(extra, "write()");
    const { signal } = checkOptions(options, SIGNAL_ONLY, "write()");
    if (typeof data !== "string" && !(data instanceof Uint8Array)) {
      throw new SandkilnError("INVALID_ARGUMENT", "write(): data must be a string or a Uint8Array");
    }
    const bytes = typeof data === "string" ? encodeUTF8(data) : data.slice();
    this.inputAllowed();
    if (bytes.length > LIMITS.maxWriteBytes) {
      throw new SandkilnError("INVALID_ARGUMENT", `a write carries at most ${LIMITS.maxWriteBytes} bytes, not ${bytes.length}: split it and await each`);
    }
    if (this.inputBytes + bytes.length > LIMITS.maxInputBytes || this.inputCalls + 1 > LIMITS.maxInputCalls) {
      throw new SandkilnError("INPUT_CAPACITY",
        `the input queue holds ${LIMITS.maxInputBytes} bytes and ${LIMITS.maxInputCalls} calls; await earlier writes`);
    }
    checkSignal(signal, "write()");
    // The write holds its room in the queue until it is sent, fails, or
    // is cancelled while it waits.
    this.inputBytes += bytes.length;
    this.inputCalls++;
    let queued = true;
    const leave = () => {
      if (!queued) return;
      queued = false;
      this.inputBytes -= bytes.length;
      this.inputCalls--;
    };
    let sent = false;
    const run = this.enqueue(async () => {
      try {
        if (signal?.aborted) throw abortedWait("write", signal); // not sent: no effect
        this.stillSending();
        sent = true;
        const acc = await this.owner.transport.call<{ accepted: number }>("POST", this.path("/stdin"), {
          query: { offset: this.stdinOffset }, bytes, signal,
        });
        this.stdinOffset = Math.max(this.stdinOffset, acc.accepted);
      } catch (err) {
        throw this.inputFailed(err);
      } finally {
        leave();
      }
    });
    // Cancelled while queued, it rejects at once and is never sent; once
    // sent, the abort goes to the request (its outcome is then unknown).
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        if (sent) return;
        leave();
        reject(abortedWait("write", signal!));
      };
      const onGone = () => {
        leave();
        reject(this.detachedError());
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.life.signal.addEventListener("abort", onGone, { once: true });
      const done = () => {
        signal?.removeEventListener("abort", onAbort);
        this.life.signal.removeEventListener("abort", onGone);
      };
      run.then(() => {
        done();
        resolve();
      }, (err) => {
        done();
        reject(err);
      });
    });
  }

  /** Sends end-of-input once every earlier write is delivered; closing again does nothing. */
  protected closeInput(options: SignalOptions, extra: readonly unknown[]): Promise<void> {
    let signal: AbortSignal | undefined;
    try {
      noMore(extra, "closeStdin()");
      ({ signal } = checkOptions(options, SIGNAL_ONLY, "closeStdin()"));
      if (this.stdinClosed && !this.gone) return Promise.resolve();
      if (this.closing) return this.settle(this.closing, signal, "closeStdin");
      this.inputAllowed();
      checkSignal(signal, "closeStdin()");
    } catch (err) {
      return Promise.reject(err);
    }
    this.closing = this.enqueue(async () => {
      try {
        // Writes queued before it went first; only what happened since
        // (the handle gone, a write's outcome lost) stops it.
        this.stillSending();
        await this.owner.transport.call("POST", this.path("/stdin/close"));
        this.stdinClosed = true;
      } catch (err) {
        throw this.inputFailed(err);
      } finally {
        this.closing = undefined;
      }
    });
    return this.settle(this.closing, signal, "closeStdin");
  }

  private enqueue<T>(run: () => Promise<T>): Promise<T> {
    const p = this.inputTail.then(run);
    this.inputTail = p.catch(() => undefined);
    return p;
  }

  /** Refuses new input: the handle gone, no pipe, input uncertain, or stdin closed or closing. */
  private inputAllowed(): void {
    if (this.gone) throw this.detachedError();
    if (!this.settings.stdinPipe) throw new SandkilnError("STDIN_CLOSED", `process ${this.id} has no stdin pipe: start it with stdin: "pipe"`);
    if (this.uncertain) throw this.uncertain;
    if (this.stdinClosed || this.closing) throw new SandkilnError("STDIN_CLOSED", `process ${this.id}: stdin is closed`);
  }

  /** What stops input already queued from being sent: the handle gone, or an earlier input's outcome lost. */
  private stillSending(): void {
    if (this.gone) throw this.detachedError();
    if (this.uncertain) throw this.uncertain;
  }

  private inputFailed(err: unknown): unknown {
    if (err instanceof SandkilnError && err.code === "OUTCOME_UNKNOWN") {
      this.uncertain = new SandkilnError("INPUT_UNCERTAIN",
        `process ${this.id}: an earlier input's delivery is unknown; input is disabled`, { cause: err });
    }
    return err;
  }

  /**
   * A reference to return to the process with reopen(), after
   * disconnect(). It follows this handle until the handle is let go, so a
   * reference taken before disconnect() resumes exactly where the output
   * stood at the end. It refuses while an end-of-input is unacknowledged or
   * input delivery is uncertain.
   */
  reference(...extra: never[]): ProcessReference {
    noMore(extra, "reference()");
    if (this.gone) throw this.detachedError();
    if (this.closing) throw new SandkilnError("FAILED_PRECONDITION", `process ${this.id}: end-of-input is not acknowledged yet`);
    if (this.uncertain) throw this.uncertain;
    const r = {} as ProcessReference;
    this.fillReference(r);
    this.references.push(r);
    return r;
  }

  private fillReference(r: ProcessReference): void {
    Object.assign(r, {
      kind: this.settings.terminal ? "terminal" : "process",
      version: 1,
      sandbox: this.owner.id,
      process: this.id,
      offsets: { ...this.offsets },
      lost: { ...this.lostBy },
      ended: { ...this.ended },
      stdin: { pipe: this.settings.stdinPipe, offset: this.stdinOffset, closed: this.stdinClosed },
      format: this.settings.format,
      mode: this.settings.mode,
      maxOutputBytes: this.settings.maxOutputBytes,
      overflow: this.settings.overflow,
      hold: this.settings.hold,
      expiresAt: r.expiresAt ?? new Date(Date.now() + LIMITS.referenceLifetimeMs).toISOString(),
    } satisfies ProcessReference);
  }

  /** Releases this handle's connections, leaving the process, its stdin and the output it holds (for reopen(), within kilnd's grace) as they are; the handle refuses what comes after. */
  async disconnect(...extra: never[]): Promise<void> {
    noMore(extra, "disconnect()");
    this.letGo(false);
  }

  /** Releases this handle's connections and discards unread output; the process no longer waits for this handle. It never kills the process. Calling it again is safe. */
  async detach(...extra: never[]): Promise<void> {
    noMore(extra, "detach()");
    this.letGo(true);
  }

  /** @internal Lets the handle go (a detach, a disconnect, its client closed, its sandbox destroyed through this client); with release, the output held for it too. */
  letGo(release: boolean): void {
    if (this.gone) return;
    if (release) this.release();
    this.gone = true;
    this.references = [];
    const q = this.queue;
    if (q) q.stopped = true;
    this.hangUp();
    q?.clear();
    q?.push({ kind: "error", err: this.detachedError() });
    this.life.abort(this.detachedError());
    this.owner.release(this as Handle<Chunk>);
  }

  private detachedError(): SandkilnError {
    return new SandkilnError("DETACHED", `process ${this.id}: the handle was detached or disconnected`);
  }
}

/** A process on pipes: separate stdout and stderr, input with an explicit end. */
export class ProcessHandle<C extends Chunk = TextChunk> extends Handle<C> {
  /**
   * The output as chunks of text or bytes, replay then live; see the
   * class's notes on the queue, holding, overflow and resuming.
   */
  output(options: SignalOptions = {}, ...extra: never[]): AsyncGenerator<C, void, undefined> {
    return this.outputChunks(options, extra);
  }

  /** Sends end-of-input (EOF) after earlier writes; later writes reject. Repeated closes send nothing. */
  closeStdin(options: SignalOptions = {}, ...extra: never[]): Promise<void> {
    return this.closeInput(options, extra);
  }
}

/** A process on a terminal: one output stream of bytes, input through the terminal (Ctrl+D is input, not a close). */
export class TerminalHandle extends Handle<ByteChunk> {
  /**
   * The terminal's output, stdout and stderr combined, as Uint8Array
   * chunks. A terminal's output is never reported with gaps: bytes lost
   * to this handle fail it with OUTPUT_CAPACITY.
   */
  async *output(options: SignalOptions = {}, ...extra: never[]): AsyncGenerator<Uint8Array, void, undefined> {
    const chunks = this.outputChunks(options, extra);
    try {
      for await (const c of chunks) yield c.bytes;
    } finally {
      await chunks.return(undefined);
    }
  }

  /** Changes the terminal's size. */
  async resize(size: { columns: number; rows: number }, options: SignalOptions = {}, ...extra: never[]): Promise<void> {
    noMore(extra, "resize()");
    const { signal } = checkOptions(options, SIGNAL_ONLY, "resize()");
    checkOptions(size, ["columns", "rows"], "resize()");
    checkSize(size.columns, size.rows);
    checkSignal(signal, "resize()");
    await this.owner.transport.call("POST", `/sandboxes/${encodeURIComponent(this.owner.id)}/exec-stream/${encodeURIComponent(this.id)}/resize`, {
      json: { cols: size.columns, rows: size.rows }, idempotent: true, signal,
    });
  }
}

export function checkSize(columns: number, rows: number): void {
  for (const [name, v] of [["columns", columns], ["rows", rows]] as const) {
    if (!Number.isInteger(v) || v < 1 || v > 4096) throw new SandkilnError("INVALID_ARGUMENT", `${name} ${v}: want 1 to 4096`);
  }
}
