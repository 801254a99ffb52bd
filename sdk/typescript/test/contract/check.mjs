// Assertions for the contract suite, in plain JavaScript so that the same
// cases run under node:test (Node, Bun, Deno) and in a browser page.

import { SandkilnError } from "../../dist/index.js";

export class CheckError extends Error {
  constructor(message) {
    super(message);
    this.name = "CheckError";
  }
}

const show = (v) => {
  try {
    return JSON.stringify(v, (_, x) => (x instanceof Uint8Array ? `Uint8Array(${x.length})` : x));
  } catch {
    return String(v);
  }
};

export function ok(v, msg = "expected a true value") {
  if (!v) throw new CheckError(msg);
}

export function eq(actual, expected, msg = "") {
  if (!Object.is(actual, expected)) throw new CheckError(`${msg ? msg + ": " : ""}got ${show(actual)}, want ${show(expected)}`);
}

function same(a, b) {
  if (Object.is(a, b)) return true;
  if (a instanceof Uint8Array && b instanceof Uint8Array) return a.length === b.length && a.every((x, i) => x === b[i]);
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a).filter((k) => a[k] !== undefined).sort();
  const kb = Object.keys(b).filter((k) => b[k] !== undefined).sort();
  return ka.length === kb.length && ka.every((k, i) => k === kb[i] && same(a[k], b[k]));
}

export function deep(actual, expected, msg = "") {
  if (!same(actual, expected)) throw new CheckError(`${msg ? msg + ": " : ""}got ${show(actual)}, want ${show(expected)}`);
}

/** Checks that err is a SandkilnError of code, and returns it. */
export function isError(err, code, msg = "") {
  if (!(err instanceof SandkilnError)) throw new CheckError(`${msg ? msg + ": " : ""}not a SandkilnError: ${err?.stack ?? err}`);
  if (err.code !== code) throw new CheckError(`${msg ? msg + ": " : ""}code ${err.code} (${err.message}), want ${code}`);
  return err;
}

/** Awaits p, which must reject with a SandkilnError of code; returns the error. */
export async function rejects(p, code, msg = "") {
  let value;
  try {
    value = await p;
  } catch (err) {
    return isError(err, code, msg);
  }
  throw new CheckError(`${msg ? msg + ": " : ""}resolved with ${show(value)}, want a rejection with ${code}`);
}

/** Calls f, which must throw a SandkilnError of code. */
export function throws(f, code, msg = "") {
  try {
    f();
  } catch (err) {
    return isError(err, code, msg);
  }
  throw new CheckError(`${msg ? msg + ": " : ""}returned, want ${code}`);
}

/** Resolves with p's value, or fails after ms (a hang is a failure, not a timing claim). */
export function within(p, ms, what) {
  let timer;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new CheckError(`${what}: not within ${ms} ms`)), ms);
    }),
  ]);
}
