// A streaming UTF-8 decoder for one stream, which says how many bytes of
// a character it still holds: those are not delivered yet, so a handle that
// resumes asks for them again.

const encoder = new TextEncoder();

export function encodeUTF8(s: string): Uint8Array {
  return encoder.encode(s);
}

/** Decodes one stream's bytes across chunks; reset it at a gap. */
export class StreamDecoder {
  private decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  /** The last bytes that came (at most 3), to find a character held back. */
  private last = new Uint8Array(0);

  /** Bytes of an incomplete character at the end of what came so far. */
  get held(): number {
    return incompleteTail(this.last);
  }

  decode(b: Uint8Array): string {
    const text = this.decoder.decode(b, { stream: true });
    const joined = new Uint8Array(this.last.length + b.length);
    joined.set(this.last);
    joined.set(b, this.last.length);
    this.last = joined.slice(Math.max(0, joined.length - 3));
    return text;
  }

  /**
   * Ends the stream (at its end, or at a gap): a character still held can
   * never complete and is one replacement character.
   */
  flush(): string {
    const text = this.held > 0 ? this.decoder.decode() : "";
    this.decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
    this.last = new Uint8Array(0);
    return text;
  }
}

/**
 * How many bytes at the end of b begin a character not yet complete: what
 * a streaming decoder holds back. (An incomplete character is at most 3
 * bytes, so b need hold no more than the last 3.)
 */
export function incompleteTail(b: Uint8Array): number {
  const n = b.length;
  for (let back = 1; back <= Math.min(3, n); back++) {
    const i = n - back;
    const c = b[i]!;
    if ((c & 0xc0) === 0x80) continue; // a continuation byte
    const want = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 1;
    return back < want && validSoFar(b, i, back) ? back : 0;
  }
  return 0;
}

/** The lead byte at i with back-1 continuation bytes after it could still complete. */
function validSoFar(b: Uint8Array, i: number, back: number): boolean {
  if (back < 2) return true;
  const lead = b[i]!;
  const second = b[i + 1]!;
  // The second byte's narrower ranges (no overlongs, no surrogates, at most U+10FFFF).
  if (lead === 0xe0) return second >= 0xa0;
  if (lead === 0xed) return second <= 0x9f;
  if (lead === 0xf0) return second >= 0x90;
  if (lead === 0xf4) return second <= 0x8f;
  return true;
}
