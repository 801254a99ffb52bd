// What a caller passes, checked before anything is sent: an option the SDK
// does not know, or one in the wrong place, is refused, never ignored (a
// limit a caller asked for and did not get is worse than an error).

import { SandkilnError } from "./errors.js";

/**
 * Returns o (an options object; undefined is none) after checking that
 * it is a plain object whose keys are all allowed.
 */
export function checkOptions<T extends object>(o: T | undefined, allowed: readonly string[], what: string): T {
  if (o === undefined) return {} as T;
  if (o === null || typeof o !== "object" || Array.isArray(o)) {
    throw new SandkilnError("INVALID_ARGUMENT", `${what}: options must be an object, not ${o === null ? "null" : Array.isArray(o) ? "an array" : typeof o}`);
  }
  const unknown = Object.keys(o).filter((k) => !allowed.includes(k));
  if (unknown.length > 0) {
    throw new SandkilnError("INVALID_ARGUMENT",
      `${what}: unknown option${unknown.length > 1 ? "s" : ""} ${unknown.map((k) => JSON.stringify(k)).join(", ")}; it takes ${allowed.join(", ")}`);
  }
  return o;
}

/** Refuses arguments past the last a method takes: a { signal } given as a second argument is not applied, so it is an error. */
export function noMore(extra: readonly unknown[], what: string): void {
  if (extra.length > 0) {
    throw new SandkilnError("INVALID_ARGUMENT", `${what} takes ${extra.length > 1 ? "fewer" : "one fewer"} argument${extra.length > 1 ? "s" : ""}: put every option in its options object`);
  }
}

/** Refuses a signal that is not an AbortSignal, and rejects at once for one already aborted: nothing is done. */
export function checkSignal(signal: AbortSignal | undefined, what: string): void {
  if (signal === undefined) return;
  if (typeof signal !== "object" || signal === null || typeof signal.aborted !== "boolean" || typeof signal.addEventListener !== "function") {
    throw new SandkilnError("INVALID_ARGUMENT", `${what}: signal must be an AbortSignal`);
  }
  if (signal.aborted) throw new SandkilnError("WAIT_ABORTED", `${what}: aborted before it began`, { cause: signal.reason });
}

/** Options that take only a signal. */
export const SIGNAL_ONLY = ["signal"] as const;
