// Bounded diagnostic text from output: lines as they come, and a rolling
// tail. Neither keeps a transcript or touches the process.

import { SandkilnError } from "./errors.js";
import { checkOptions, checkSignal, noMore } from "./options.js";
import type { Chunk, SignalOptions, StreamName } from "./process.js";
import { encodeUTF8 } from "./utf8.js";

/** One line of output, without its newline (LF or CRLF). */
export interface ProcessLine {
  stream: StreamName;
  text: string;
  /** The output ended (or the window does) without a newline after it. */
  partial: boolean;
  /** The line was longer than maxLineBytes: clipped, the rest discarded to its newline. */
  truncated: boolean;
}

export interface LineOptions extends SignalOptions {
  /** A line's most bytes (UTF-8), 16 KiB by default. */
  maxLineBytes?: number;
}

function bound(name: string, v: number | undefined, def: number): number {
  const n = v ?? def;
  if (!Number.isInteger(n) || n < 1) throw new SandkilnError("INVALID_ARGUMENT", `${name} ${n}: want a positive integer`);
  return n;
}

/** Splits one stream's bytes into lines, each clipped at max bytes. */
class LineSplitter {
  private parts: Uint8Array[] = [];
  private size = 0;
  private clipped = false;
  private readonly decoder = new TextDecoder();

  constructor(
    private readonly stream: StreamName,
    private readonly max: number,
  ) {}

  /** The lines b completes. */
  push(b: Uint8Array, out: ProcessLine[]): void {
    let start = 0;
    for (;;) {
      const nl = b.indexOf(0x0a, start);
      const piece = b.subarray(start, nl < 0 ? b.length : nl);
      this.take(piece);
      if (nl < 0) return;
      out.push(this.line(false));
      start = nl + 1;
    }
  }

  /** What is left, a partial line, if anything. */
  end(out: ProcessLine[]): void {
    if (this.size > 0 || this.clipped) out.push(this.line(true));
  }

  private take(piece: Uint8Array): void {
    const room = this.max + 1 - this.size; // one more, for a CR before the newline
    if (piece.length > room) this.clipped = true;
    const kept = piece.subarray(0, Math.max(0, room));
    if (kept.length > 0) {
      this.parts.push(kept.slice());
      this.size += kept.length;
    }
  }

  private line(partial: boolean): ProcessLine {
    let b = new Uint8Array(this.size);
    let at = 0;
    for (const p of this.parts) {
      b.set(p, at);
      at += p.length;
    }
    if (!partial && b.length > 0 && b[b.length - 1] === 0x0d) b = b.subarray(0, b.length - 1);
    let truncated = this.clipped;
    if (b.length > this.max) {
      b = b.subarray(0, cutAt(b, this.max));
      truncated = true;
    }
    this.parts = [];
    this.size = 0;
    this.clipped = false;
    return { stream: this.stream, text: this.decoder.decode(b), partial, truncated };
  }
}

/** The longest prefix of at most max bytes that ends on a character's boundary. */
function cutAt(b: Uint8Array, max: number): number {
  let n = max;
  while (n > 0 && n < b.length && (b[n]! & 0xc0) === 0x80) n--;
  return n;
}

/** A chunk of a process's output, or a terminal's bytes. */
type Piece = Chunk | Uint8Array;

function bytesOf(c: Chunk | Uint8Array): Uint8Array {
  if (c instanceof Uint8Array) return c;
  return "bytes" in c ? c.bytes : encodeUTF8(c.text);
}

function streamOf(c: Piece): StreamName {
  return c instanceof Uint8Array ? "terminal" : c.stream;
}

function lostOf(c: Piece): number {
  return c instanceof Uint8Array ? 0 : c.lost;
}

/**
 * Lines of a process's output (a process's chunks, or a terminal's
 * bytes), per stream, as they complete: UTF-8 split across chunks and
 * CRLF handled, lines longer than maxLineBytes clipped and marked
 * truncated, a last line without a newline marked partial, as is a line a
 * gap cuts (overflow "report"). Aborting the signal stops reading at once,
 * whatever iterable the output is (only output observation).
 */
export async function* readProcessLines(output: AsyncIterable<Piece>, options: LineOptions = {}, ...extra: never[]): AsyncGenerator<ProcessLine, void, undefined> {
  noMore(extra, "readProcessLines()");
  checkOptions(options, ["maxLineBytes", "signal"], "readProcessLines()");
  if (output === null || typeof output !== "object" || typeof (output as AsyncIterable<Piece>)[Symbol.asyncIterator] !== "function") {
    throw new SandkilnError("INVALID_ARGUMENT", "readProcessLines(): output must be an async iterable, such as a handle's output()");
  }
  const max = bound("maxLineBytes", options.maxLineBytes, 16_384);
  const signal = options.signal;
  checkSignal(signal, "readProcessLines()");
  const splitters = new Map<StreamName, LineSplitter>();
  const it = output[Symbol.asyncIterator]();
  const aborted = signal
    ? new Promise<never>((_, reject) => {
        signal.addEventListener("abort", () => reject(new SandkilnError("WAIT_ABORTED", "readProcessLines: aborted", { cause: signal.reason })), { once: true });
      })
    : undefined;
  aborted?.catch(() => {});
  // A next() still waiting when the signal aborts: the iterator is then
  // told to return, but not waited for (an async generator's return waits
  // for its pending next(), which for a quiet process may be forever).
  let waiting = false;
  try {
    for (;;) {
      waiting = true;
      const r = await (aborted ? Promise.race([it.next(), aborted]) : it.next());
      waiting = false;
      if (r.done) break;
      const c = r.value;
      const stream = streamOf(c);
      let s = splitters.get(stream);
      if (!s) splitters.set(stream, (s = new LineSplitter(stream, max)));
      const out: ProcessLine[] = [];
      if (lostOf(c) > 0) s.end(out); // the line the gap cuts ends there
      else s.push(bytesOf(c), out);
      yield* out;
    }
    const out: ProcessLine[] = [];
    for (const s of splitters.values()) s.end(out);
    yield* out;
  } finally {
    const ret = it.return?.();
    if (waiting) Promise.resolve(ret).catch(() => undefined);
    else await ret;
  }
}

export interface TailOptions {
  /** Output kept, 64 KiB by default. */
  maxBytes?: number;
  /** Chunks kept, 256 by default. */
  maxChunks?: number;
  /** Lines a snapshot gives, the last ones, 200 by default. */
  maxLines?: number;
  /** A line's most bytes, 16 KiB by default. */
  maxLineBytes?: number;
}

export interface TailSnapshot {
  lines: ProcessLine[];
  /** Older output was discarded: the window may begin inside a line or a character. */
  truncated: boolean;
}

export interface ProcessTail {
  /** Adds a chunk (or a terminal's bytes); pass each chunk while saving it to your own log. */
  push(chunk: Chunk | Uint8Array): void;
  /** The window now, as lines; each snapshot is independent. */
  snapshot(): TailSnapshot;
}

/** A rolling window of recent output, for diagnostics. */
export function createProcessTail(options: TailOptions = {}, ...extra: never[]): ProcessTail {
  noMore(extra, "createProcessTail()");
  checkOptions(options, ["maxBytes", "maxChunks", "maxLines", "maxLineBytes"], "createProcessTail()");
  const maxBytes = bound("maxBytes", options.maxBytes, 65_536);
  const maxChunks = bound("maxChunks", options.maxChunks, 256);
  const maxLines = bound("maxLines", options.maxLines, 200);
  const maxLineBytes = bound("maxLineBytes", options.maxLineBytes, 16_384);
  let window: { stream: StreamName; bytes: Uint8Array }[] = [];
  let size = 0;
  let truncated = false;
  return {
    push(c: Chunk | Uint8Array): void {
      if (lostOf(c) > 0) {
        truncated = true;
        return;
      }
      let b = bytesOf(c);
      if (b.length === 0) return;
      const stream = streamOf(c);
      if (b.length > maxBytes) {
        b = b.subarray(b.length - maxBytes);
        truncated = true;
      }
      window.push({ stream, bytes: b.slice() });
      size += b.length;
      while (window.length > maxChunks || size > maxBytes) {
        const first = window[0]!;
        truncated = true;
        if (window.length > maxChunks || size - first.bytes.length >= maxBytes) {
          window.shift();
          size -= first.bytes.length;
        } else {
          const cut = size - maxBytes;
          first.bytes = first.bytes.subarray(cut);
          size -= cut;
        }
      }
    },
    snapshot(): TailSnapshot {
      const splitters = new Map<StreamName, LineSplitter>();
      const lines: ProcessLine[] = [];
      for (const { stream, bytes } of window) {
        let s = splitters.get(stream);
        if (!s) splitters.set(stream, (s = new LineSplitter(stream, maxLineBytes)));
        s.push(bytes, lines);
      }
      for (const s of splitters.values()) s.end(lines);
      // Lines past maxLines are discarded too: the snapshot says so.
      return { lines: lines.slice(Math.max(0, lines.length - maxLines)), truncated: truncated || lines.length > maxLines };
    },
  };
}
