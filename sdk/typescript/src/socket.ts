// The WebSocket the SDK uses: its own on Node (nodesocket.ts), else the
// runtime's (browsers, Bun, Deno), or the ws package's on a Node before
// 20.16, which cannot load Node's modules without an import.

import type { NodeSocket } from "./nodesocket.js";

/** The part of the WebSocket API the SDK uses; ws's class has it too. */
export interface Socket {
  readonly protocol: string;
  binaryType: string;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  send(data: string | ArrayBufferView | ArrayBuffer): void;
  close(code?: number, reason?: string): void;
  /** ws's alone: stop and go on reading. */
  pause?(): void;
  resume?(): void;
}

type SocketClass = new (url: string, protocols: string[]) => Socket;

let found: Promise<SocketClass> | undefined;
let nodeSocket: Promise<(url: string, protocols: string[], borrow: boolean) => NodeSocket> | undefined;

/**
 * The SDK's own socket where the runtime is Node (not Bun or Deno, which
 * look like it) and can load Node's modules (20.16 and later), else
 * undefined. Imported when first needed: a browser's build never loads it.
 */
function nodeSocketMaker(): Promise<(url: string, protocols: string[], borrow: boolean) => NodeSocket> | undefined {
  const g = globalThis as { process?: { versions?: Record<string, string>; getBuiltinModule?: unknown }; Bun?: unknown; Deno?: unknown };
  const p = g.process;
  if (!p?.versions?.node || p.versions.bun || p.versions.deno || g.Bun || g.Deno || typeof p.getBuiltinModule !== "function") return undefined;
  nodeSocket ??= import("./nodesocket.js").then(({ NodeSocket, nodeModules }) => {
    const mods = nodeModules();
    return (url, protocols, borrow) => new NodeSocket(url, protocols, mods, borrow);
  });
  return nodeSocket;
}

function socketClass(): Promise<SocketClass> {
  found ??= (async () => {
    const global = (globalThis as { WebSocket?: SocketClass }).WebSocket;
    if (global) return global;
    try {
      // Node 20 has no WebSocket of its own.
      const ws = (await import("ws" as string)) as { WebSocket?: SocketClass; default?: SocketClass };
      const cls = ws.WebSocket ?? ws.default;
      if (cls) return cls;
    } catch {
      // said below
    }
    throw new Error("this runtime has no WebSocket: on Node 20, install the ws package (npm install ws)");
  })();
  return found;
}

/** What a socket's messages and close go to, from the moment it is made. */
export interface SocketHandlers {
  message(data: unknown): void;
  close(code: number, reason: string): void;
  /**
   * message copies what it keeps of a binary message: it may be given a
   * Uint8Array valid only while it runs (the SDK's own socket on Node
   * does), else an ArrayBuffer.
   */
  borrow?: boolean;
}

/**
 * Opens a WebSocket and resolves once it is open, with binary messages as
 * ArrayBuffers. Its messages and close go to on from the start: a server
 * that speaks first may be heard in the same turn as the open. It rejects
 * with the reason the runtime gives (a browser gives none: no status, no
 * body), and on then hears nothing.
 */
export async function openSocket(url: string, protocols: string[], on: SocketHandlers, signal?: AbortSignal): Promise<Socket> {
  const make = nodeSocketMaker();
  const node = make ? await make : undefined;
  const Cls = node ? undefined : await socketClass();
  return new Promise<Socket>((resolve, reject) => {
    const s = node ? node(url, protocols, on.borrow ?? false) : new Cls!(url, protocols);
    s.binaryType = "arraybuffer";
    let open = false;
    const onAbort = () => {
      s.onmessage = s.onclose = s.onerror = null;
      s.close();
      reject(signal?.reason ?? new Error("aborted"));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    const opened = () => {
      if (open) return;
      open = true;
      signal?.removeEventListener("abort", onAbort);
      resolve(s);
    };
    // A message is proof of the open too: a runtime may deliver what came
    // with the handshake before its open event, or, if the connection
    // broke right after, instead of it.
    s.onmessage = (ev) => {
      opened();
      on.message(ev.data);
    };
    s.onopen = opened;
    s.onerror = (ev) => {
      if (open) return; // the close says the rest
      signal?.removeEventListener("abort", onAbort);
      const msg = (ev as { message?: unknown } | null)?.message;
      reject(new Error(typeof msg === "string" && msg ? msg : "the WebSocket did not open"));
    };
    s.onclose = (ev) => {
      if (open) {
        on.close(ev.code, ev.reason);
        return;
      }
      signal?.removeEventListener("abort", onAbort);
      reject(new Error(`the WebSocket closed before it opened (${ev.code})`));
    };
  });
}
