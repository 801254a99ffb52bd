// A sandbox's captured logs: the output of processes started with
// capture, kept durably, read back as bytes or as records.

import { SandkilnError } from "./errors.js";
import { guarded, ndjson } from "./ndjson.js";
import type { SignalOptions } from "./process.js";
import type { Sandbox } from "./client.js";
import type { components } from "./wire.js";

type Schemas = components["schemas"];
/** A captured process's log: its runs, each classified, and what reading it could not return. */
export type CapturedLog = Schemas["CapturedLog"];
/** One record of a captured log (format json): a write's content and time, or a gap lost to rotation. */
export type LogRecord = Schemas["LogRecord"];

/** What of a captured log to read; the default is all of it, both streams, not followed. */
export interface LogReadOptions extends SignalOptions {
  /** One stream only. */
  stream?: "stdout" | "stderr";
  /** The last tail lines; 0: none (with follow, only what comes next). */
  tail?: number;
  /** From this time: a Date, an RFC 3339 time, or a duration back from now ("5m"). */
  since?: Date | string;
  /** Up to this time, as since. */
  until?: Date | string;
  /** Go on with what is written until the process has ended and its log says so. */
  follow?: boolean;
  /** "log": the captured log alone; "best" (the default): while the sandbox runs, the process's output from kilnd's ring where the log no longer has it. */
  source?: "best" | "log";
}

function timeOf(t: Date | string | undefined): string | undefined {
  if (t === undefined) return undefined;
  if (t instanceof Date) {
    if (Number.isNaN(t.getTime())) throw new SandkilnError("INVALID_ARGUMENT", "logs: an invalid Date");
    return t.toISOString();
  }
  return t;
}

export class Logs {
  private readonly s: Sandbox;

  /** @internal */
  constructor(s: Sandbox) {
    this.s = s;
  }

  /** The sandbox's captured logs, each with its runs and whether every run is lossless. */
  async list(options: SignalOptions = {}): Promise<CapturedLog[]> {
    return (await this.s.transport.call<CapturedLog[] | null>("GET", this.s.path("/logs"), { idempotent: true, signal: options.signal })) ?? [];
  }

  /**
   * A process's captured output, the bytes as it wrote them (both streams
   * as they came, unless stream says one). kilnd sends the runs and the
   * bytes lost in trailers (Kiln-Runs, Kiln-Complete, Kiln-Lost), which
   * fetch does not give: list() says of each run once the read is done.
   * A failure of the stream is a SandkilnError (UNAVAILABLE, or
   * WAIT_ABORTED when the signal ended it).
   */
  async read(pid: string, options: LogReadOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const what = `logs of ${pid}`;
    const resp = await this.fetch(pid, options, "raw");
    return guarded(resp.body!, what, options.signal);
  }

  /**
   * A process's captured output as records (format json): each with its
   * stream and time, its content as text (or base64 when it is not UTF-8),
   * without the newline that ended it unless partial is true; a gap
   * record counts the log bytes lost to rotation while reading.
   */
  async *records(pid: string, options: LogReadOptions = {}): AsyncGenerator<LogRecord, void, undefined> {
    const resp = await this.fetch(pid, options, "json");
    yield* ndjson<LogRecord>(resp.body!, `records of ${pid}`, options.signal);
  }

  private fetch(pid: string, o: LogReadOptions, format: "raw" | "json"): Promise<Response> {
    if (!pid) throw new SandkilnError("INVALID_ARGUMENT", "logs: a process id is needed");
    if (o.tail !== undefined && (!Number.isInteger(o.tail) || o.tail < 0)) {
      throw new SandkilnError("INVALID_ARGUMENT", `logs: tail ${o.tail}: want a whole number, 0 or more`);
    }
    if (o.stream !== undefined && o.stream !== "stdout" && o.stream !== "stderr") {
      throw new SandkilnError("INVALID_ARGUMENT", `logs: stream ${JSON.stringify(o.stream)}: want "stdout" or "stderr"`);
    }
    return this.s.transport.fetch("GET", this.s.path(`/logs/${encodeURIComponent(pid)}`), {
      query: {
        stream: o.stream, tail: o.tail, since: timeOf(o.since), until: timeOf(o.until), follow: o.follow || undefined,
        format: format === "json" ? "json" : undefined, source: o.source,
      },
      idempotent: true, unbounded: true, signal: o.signal,
    });
  }
}
