// Lines of JSON from an answer's body, as kilnd streams them (an image
// pull's or import's progress, a captured log's records).

import { SandkilnError } from "./errors.js";
import { message } from "./http.js";

/** The longest line read (an import's last line lists its images). */
const MAX_LINE = 4 << 20;

/** Each line of body parsed; a line that is not JSON, or one too long, fails it as INTERNAL. */
export async function* ndjson<T>(body: ReadableStream<Uint8Array>, what: string, signal?: AbortSignal): AsyncGenerator<T, void, undefined> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (err) {
        if (signal?.aborted) throw new SandkilnError("WAIT_ABORTED", `${what}: aborted`, { cause: signal.reason });
        throw new SandkilnError("UNAVAILABLE", `${what}: the answer broke off: ${message(err)}`, { cause: err });
      }
      buf += chunk.done ? decoder.decode() : decoder.decode(chunk.value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.trim()) yield parse<T>(line, what);
      }
      if (buf.length > MAX_LINE) throw new SandkilnError("INTERNAL", `${what}: a line of the answer is over ${MAX_LINE} bytes`);
      if (chunk.done) {
        if (buf.trim()) yield parse<T>(buf, what);
        return;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

function parse<T>(line: string, what: string): T {
  try {
    return JSON.parse(line) as T;
  } catch (err) {
    throw new SandkilnError("INTERNAL", `${what}: a line of the answer is not JSON`, { cause: err });
  }
}

/**
 * body as a stream whose failure is a SandkilnError: WAIT_ABORTED when
 * signal ended it, UNAVAILABLE when the answer broke off. Cancelling it
 * cancels body.
 */
export function guarded(body: ReadableStream<Uint8Array>, what: string, signal?: AbortSignal): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      let r: ReadableStreamReadResult<Uint8Array>;
      try {
        r = await reader.read();
      } catch (err) {
        controller.error(signal?.aborted
          ? new SandkilnError("WAIT_ABORTED", `${what}: aborted`, { cause: signal.reason })
          : new SandkilnError("UNAVAILABLE", `${what}: the answer broke off: ${message(err)}`, { cause: err }));
        return;
      }
      if (r.done) controller.close();
      else controller.enqueue(r.value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  }, { highWaterMark: 0 });
}
