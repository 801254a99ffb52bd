// The client, its sandboxes, and what a sandbox offers: processes,
// terminals, exec, files, previews.

import { SandkilnError } from "./errors.js";
import { CONTROL_TIMEOUT_MS, message, Transport } from "./http.js";
import { checkOptions, checkSignal, noMore, SIGNAL_ONLY } from "./options.js";
import {
  checkSize,
  exitOf,
  LIMITS,
  ProcessHandle,
  TerminalHandle,
  type ByteChunk,
  type Chunk,
  type Exit,
  type Handle,
  type HandleOwner,
  type HandleSettings,
  type ProcessReference,
  type SignalOptions,
  type TextChunk,
} from "./process.js";
import { StreamDecoder } from "./utf8.js";
import { Logs } from "./logs.js";
import { guarded, ndjson } from "./ndjson.js";
import { Ports } from "./ports.js";
import type { components } from "./wire.js";

type Schemas = components["schemas"];
/** A sandbox as kilnd describes it. */
export type SandboxInfo = Schemas["Sandbox"];
/** What a sandbox is created with (the body of POST /sandboxes). */
export type SandboxOptions = Schemas["CreateSandbox"];
/** A host directory bound into a sandbox (SandboxOptions.mounts), as docker run -v binds one. */
export type Mount = Schemas["Mount"];
/** A sandbox's state: in a cluster also "unknown" (its node missed its heartbeats) and "node_lost" (its node is gone; it did not exit). */
export type SandboxState = SandboxInfo["state"];
/** A node of kilnd's cluster (kilnd --cluster), as its last heartbeat told. */
export type NodeInfo = Schemas["Node"];
/** What GET /healthz and GET /readyz answer: status "ok", or at /readyz why kilnd is not ready; cluster on a kilnd in one. */
export type Health = Schemas["Health"];

/** What Client.events gives; each left out: all of them, following. */
export interface EventOptions extends SignalOptions {
  /** The seq of the last event read: those after it. */
  after?: number;
  /** One sandbox's events, by its id. */
  sandbox?: string;
  /** In a cluster, one node's events, by its name (outside one: none). */
  node?: string;
  type?: "sandbox.created" | "sandbox.started" | "sandbox.stopped" | "sandbox.deleted" | "sandbox.paused" | "sandbox.resumed";
  /** false: the events kilnd holds, then the end. */
  follow?: boolean;
}

/** What Sandboxes.list chooses by; each left out chooses all. */
export interface SandboxFilter {
  label?: string | readonly string[] | Readonly<Record<string, string>>;
  name?: string;
  state?: SandboxState;
  image?: string;
  runtime?: string;
  /** In a cluster, the sandboxes of the node of that name (SandboxInfo.node); a kilnd in no cluster has none on any. */
  node?: string;
  /** The deleted sandboxes whose records kilnd keeps, too. */
  all?: boolean;
}
export type FileInfo = Schemas["FileInfo"];
export type Preview = Schemas["Preview"];
export type ImageInfo = Schemas["Image"];
/** A sandbox's files as they were at one moment (Sandbox.snapshot()). */
export type SnapshotInfo = Schemas["Snapshot"];
/** A running sandbox's CPU, memory and pids figures. */
export type SandboxStats = Schemas["SandboxStats"];
export type TopProcess = Schemas["TopProcess"];
/** A line of an image pull's or import's progress. */
export type ImageProgress = Schemas["ImageProgress"];
/** A tar to send: bytes, a Blob (a File among them), or a stream. */
export type TarBody = Uint8Array | Blob | ReadableStream<Uint8Array>;

export interface ClientOptions {
  /** kilnd's URL ("http://127.0.0.1:7777"); default $KILN_ADDR (a host:port or a URL). */
  url?: string;
  /** kilnd's token; default $KILN_TOKEN. */
  token?: string;
}

/** What a sandbox reference holds: enough to find it again. */
export interface SandboxReference {
  kind: "sandbox";
  id: string;
}

function env(name: string): string | undefined {
  const p = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return p?.env?.[name] || undefined;
}

/** Talks to one kilnd. */
export class Client {
  /** @internal */
  readonly transport: Transport;
  readonly sandboxes: Sandboxes;
  readonly images: Images;
  readonly snapshots: Snapshots;
  /** The nodes of kilnd's cluster (kilnd --cluster). */
  readonly nodes: Nodes;

  constructor(options: ClientOptions = {}) {
    let url = options.url ?? env("KILN_ADDR");
    if (!url) throw new SandkilnError("INVALID_ARGUMENT", "Client: a url is needed (or KILN_ADDR)");
    if (url.startsWith("tcp://")) url = "http://" + url.slice("tcp://".length);
    if (!/^https?:\/\//.test(url)) url = "http://" + url;
    try {
      new URL(url);
    } catch {
      throw new SandkilnError("INVALID_ARGUMENT", `Client: url ${JSON.stringify(url)} is not a URL`);
    }
    this.transport = new Transport(url, options.token ?? env("KILN_TOKEN"));
    this.sandboxes = new Sandboxes(this);
    this.images = new Images(this.transport);
    this.snapshots = new Snapshots(this.transport);
    this.nodes = new Nodes(this.transport);
  }

  /** Says kilnd answers. */
  async health(options: SignalOptions = {}): Promise<boolean> {
    await this.transport.call("GET", "/healthz", { idempotent: true, signal: options.signal });
    return true;
  }

  /**
   * Whether kilnd serves all it should (GET /readyz): status "ok" when it
   * does, else why not ("cluster down": a kilnd in a cluster that cannot
   * reach it serves its own sandboxes, not the other nodes'), and cluster
   * its node's name and the cluster's state. Not being ready is an
   * answer, not an error: kilnd's 503 resolves to the health it carries.
   * It rejects when kilnd does not answer, or answers something else.
   */
  async ready(options: SignalOptions = {}): Promise<Health> {
    const what = "GET /readyz";
    const resp = await this.transport.fetch("GET", "/readyz", {
      idempotent: true, signal: options.signal, isError: (r) => r.status >= 300 && r.status !== 503,
    });
    let body: unknown;
    try {
      body = await resp.json();
    } catch {
      body = undefined;
    }
    const status = (body as { status?: unknown } | null | undefined)?.status;
    if (typeof status === "string" && status !== "") return body as Health;
    if (resp.status === 503) throw SandkilnError.fromAnswer(resp.status, body ?? null, what);
    throw new SandkilnError("INTERNAL", `kilnd: ${what}: the answer is not a health report`, { status: resp.status });
  }

  /**
   * What happens to kilnd's sandboxes, in order, each once: the events
   * kilnd holds after `after` (the `seq` of the last one read), then each
   * as it happens, until the signal aborts (or, with `follow: false`, the
   * end of those held). A connection that breaks is opened again from the
   * last event given, so nothing is missed or given twice; events kilnd no
   * longer holds come as one of type "gap" whose `lost` counts them.
   */
  async *events(options: EventOptions = {}): AsyncGenerator<Schemas["Event"], void, undefined> {
    const o = checkOptions(options, ["after", "sandbox", "node", "type", "follow", "signal"], "events()");
    checkSignal(o.signal, "events()");
    let after = o.after ?? 0;
    let epoch: string | undefined;
    for (;;) {
      try {
        const resp = await this.transport.fetch("GET", "/events", {
          query: { after, epoch, sandbox: o.sandbox, node: o.node, type: o.type, follow: o.follow === false ? false : undefined },
          idempotent: true, unbounded: true, signal: o.signal,
        });
        for await (const e of ndjson<Schemas["Event"]>(resp.body!, "events", o.signal)) {
          after = e.seq;
          epoch = e.epoch;
          yield e;
        }
        if (o.follow === false) return;
      } catch (err) {
        // A refusal, or the caller's abort, ends it; a broken connection is
        // opened again.
        if (!(err instanceof SandkilnError) || err.code !== "UNAVAILABLE" || o.signal?.aborted) throw err;
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }

  /** The build of the kilnd answering: its version, commit and Go version. */
  async version(options: SignalOptions = {}): Promise<Schemas["Version"]> {
    return this.transport.call<Schemas["Version"]>("GET", "/version", { idempotent: true, signal: options.signal });
  }

  /**
   * Lets go of every handle made through this client: their connections
   * close, their calls still waiting fail with DETACHED, and their
   * processes no longer wait for them. kilnd, its sandboxes and their
   * processes are left as they are.
   */
  async close(...extra: never[]): Promise<void> {
    noMore(extra, "close()");
    for (const s of this.sandboxes.known) s.letGoHandles(true);
  }
}

export class Sandboxes {
  /** @internal Sandboxes of this client that have handles. */
  readonly known = new Set<Sandbox>();
  private readonly client: Client;

  /** @internal */
  constructor(client: Client) {
    this.client = client;
  }

  /**
   * Creates a sandbox and resolves once it is ready. If the answer is
   * lost the error is OUTCOME_UNKNOWN: list the sandboxes before creating
   * another.
   */
  async create(options: SandboxOptions & SignalOptions = {}, ...extra: never[]): Promise<Sandbox> {
    noMore(extra, "sandboxes.create()");
    if (options === null || typeof options !== "object" || Array.isArray(options)) checkOptions(options, [], "sandboxes.create()");
    // The body's fields are kilnd's to check (it refuses what it does not know).
    const { signal, ...body } = options;
    checkSignal(signal, "sandboxes.create()");
    const info = await this.client.transport.call<SandboxInfo>("POST", "/sandboxes", { json: body, signal });
    return this.handle(info);
  }

  /**
   * The sandbox of an id, a name, a prefix of an id no other sandbox's
   * has, or a saved reference; NOT_FOUND if kilnd has none, INVALID_ARGUMENT
   * for a prefix two sandboxes share. The handle holds the full id.
   */
  async get(idOrReference: string | SandboxReference | { id: string }, options: SignalOptions = {}): Promise<Sandbox> {
    const id = typeof idOrReference === "string" ? idOrReference : idOrReference.id;
    if (!id) throw new SandkilnError("INVALID_ARGUMENT", "sandboxes.get: an id or a reference is needed");
    const info = await this.client.transport.call<SandboxInfo>("GET", `/sandboxes/${encodeURIComponent(id)}`, {
      idempotent: true, signal: options.signal,
    });
    return this.handle(info);
  }

  /**
   * The sandboxes kilnd has, oldest first; deleted ones only with
   * `all: true` (or `state: "deleted"`). Each filter given narrows the
   * list: `label` is "KEY" (has it), "KEY=VALUE", an array of those, or a
   * record of KEY to VALUE, each of which must match.
   */
  async list(options: SandboxFilter & SignalOptions = {}): Promise<SandboxInfo[]> {
    const { signal, label, name, state, image, runtime, node, all } = checkOptions(options, ["label", "name", "state", "image", "runtime", "node", "all", "signal"], "sandboxes.list()");
    const labels = label === undefined ? undefined
      : typeof label === "string" ? [label]
      : Array.isArray(label) ? [...label]
      : Object.entries(label).map(([k, v]) => `${k}=${v}`);
    const query = { label: labels, name, state, image, runtime, node, all: all ? true : undefined };
    return (await this.client.transport.call<SandboxInfo[] | null>("GET", "/sandboxes", { idempotent: true, signal, query })) ?? [];
  }

  /** @internal */
  handle(info: SandboxInfo): Sandbox {
    return new Sandbox(this.client.transport, info, this);
  }

  /** @internal Lets go of the handles on sandbox id, whichever Sandbox of this client made them. */
  letGo(id: string): void {
    for (const s of [...this.known]) if (s.id === id) s.letGoHandles(false);
  }
}

/** kilnd's stop timeout when a stop does not say, and the longest it takes. */
const DEFAULT_STOP_TIMEOUT_SECONDS = 10;
const MAX_STOP_TIMEOUT_SECONDS = 600;

/** A stop's timeoutSeconds, checked before anything is sent. */
function stopTimeout(seconds: number | undefined, what: string): number | undefined {
  if (seconds === undefined) return undefined;
  if (!Number.isInteger(seconds) || seconds < 0 || seconds > MAX_STOP_TIMEOUT_SECONDS) {
    throw new SandkilnError("INVALID_ARGUMENT", `${what}: timeoutSeconds ${seconds}: want whole seconds from 0 to ${MAX_STOP_TIMEOUT_SECONDS}`);
  }
  return seconds;
}

/** A handle on a sandbox. */
export class Sandbox implements HandleOwner {
  readonly id: string;
  /** The name it was created with, if any. */
  readonly name: string | undefined;
  /** kilnd's description when the handle was made (see refresh()). */
  info: SandboxInfo;
  readonly processes: Processes;
  readonly terminals: Terminals;
  readonly files: Files;
  readonly previews: Previews;
  /** The captured logs of its processes started with capture. */
  readonly logs: Logs;
  /** Its ports: HTTP through kilnd's proxy, and TCP connections. */
  readonly ports: Ports;
  /** @internal */
  readonly transport: Transport;
  private readonly handles = new Set<Handle<Chunk>>();
  private readonly registry: Sandboxes;

  /** @internal */
  constructor(transport: Transport, info: SandboxInfo, registry: Sandboxes) {
    this.transport = transport;
    this.info = info;
    this.id = info.id;
    this.name = info.name;
    this.registry = registry;
    this.processes = new Processes(this);
    this.terminals = new Terminals(this);
    this.files = new Files(this);
    this.previews = new Previews(this);
    this.logs = new Logs(this);
    this.ports = new Ports(this);
  }

  /** What client.sandboxes.get() takes to find this sandbox again; plain JSON. */
  get reference(): SandboxReference {
    return { kind: "sandbox", id: this.id };
  }

  /** @internal */
  path(rest: string): string {
    return `/sandboxes/${encodeURIComponent(this.id)}${rest}`;
  }

  /** @internal */
  adopt<H extends Handle<Chunk>>(h: H): H {
    this.handles.add(h as Handle<Chunk>);
    this.registry.known.add(this);
    return h;
  }

  /** @internal */
  release(h: Handle<Chunk>): void {
    this.handles.delete(h);
    if (this.handles.size === 0 && this.ports.open.size === 0) this.registry.known.delete(this);
  }

  /** @internal A port connection opened: client.close() and destroy() close it. */
  watch(): void {
    this.registry.known.add(this);
  }

  /** @internal Lets go of the handles; with release, of the output held for them too (their processes go on). */
  letGoHandles(release: boolean): void {
    for (const h of [...this.handles]) h.letGo(release);
    for (const c of [...this.ports.open]) void c.close();
  }

  /** Asks kilnd for the sandbox's description again. */
  async refresh(options: SignalOptions = {}): Promise<SandboxInfo> {
    this.info = await this.transport.call<SandboxInfo>("GET", this.path(""), { idempotent: true, signal: options.signal });
    return this.info;
  }

  /** Its CPU, memory and pids figures, read from its cgroups now; a sandbox that does not run is FAILED_PRECONDITION. */
  async stats(options: SignalOptions = {}): Promise<SandboxStats> {
    return this.transport.call<SandboxStats>("GET", this.path("/stats"), { idempotent: true, signal: options.signal });
  }

  /** Every process running in the sandbox now, as docker top lists a container's, by pid as the sandbox sees it. */
  async top(options: SignalOptions = {}): Promise<TopProcess[]> {
    return this.transport.call<TopProcess[]>("GET", this.path("/top"), { idempotent: true, signal: options.signal });
  }

  /**
   * Stops the sandbox, as docker stop does: each process's group gets
   * SIGTERM, and what has not exited after timeoutSeconds (0 to 600,
   * default 10; 0 kills at once) is killed. Its files, record and captured
   * logs stay, and start() runs it again. Resolves to its description,
   * stopped (kept in info); one stopped already is left as it is (kilnd
   * answers 304 Not Modified) and described as it is.
   */
  async stop(options: { timeoutSeconds?: number } & SignalOptions = {}, ...extra: never[]): Promise<SandboxInfo> {
    noMore(extra, "stop()");
    checkOptions(options, ["timeoutSeconds", "signal"], "stop()");
    return this.change("stop", stopTimeout(options.timeoutSeconds, "stop()"), true, options.signal);
  }

  /**
   * Starts a stopped sandbox again, as docker start does: a new instance of
   * it runs its init command again on its files as they were, with its
   * id, name, labels, limits and network policy. Resolves to its
   * description, running (kept in info); one that runs already is left as
   * it is (kilnd answers 304 Not Modified). A sandbox past its ttl, which
   * counts from its creation, is FAILED_PRECONDITION.
   */
  async start(options: SignalOptions = {}, ...extra: never[]): Promise<SandboxInfo> {
    noMore(extra, "start()");
    checkOptions(options, ["signal"], "start()");
    return this.change("start", undefined, true, options.signal);
  }

  /**
   * Stops the sandbox if it runs (stop(), with timeoutSeconds) and starts
   * it again, as docker restart does. Resolves to its description,
   * running. A lost answer is OUTCOME_UNKNOWN: it may have restarted.
   */
  async restart(options: { timeoutSeconds?: number } & SignalOptions = {}, ...extra: never[]): Promise<SandboxInfo> {
    noMore(extra, "restart()");
    checkOptions(options, ["timeoutSeconds", "signal"], "restart()");
    return this.change("restart", stopTimeout(options.timeoutSeconds, "restart()"), false, options.signal);
  }

  /**
   * Takes a snapshot of the sandbox's files, running or stopped: its disk
   * (/workspace and, with an image, the root's writes) copied while its
   * file system is frozen. It records the processes and their offsets,
   * and outlives the sandbox. With memory, a running gVisor sandbox's
   * processes are saved too (FAILED_PRECONDITION elsewhere). A sandbox
   * without a disk of its own is FAILED_PRECONDITION; past kilnd's
   * snapshot quota, PERMISSION_DENIED.
   */
  async snapshot(options: { name?: string; memory?: boolean } & SignalOptions = {}, ...extra: never[]): Promise<SnapshotInfo> {
    noMore(extra, "snapshot()");
    checkOptions(options, ["name", "memory", "signal"], "snapshot()");
    checkSignal(options.signal, "snapshot()");
    const { signal, ...json } = options;
    return this.transport.call<SnapshotInfo>("POST", this.path("/snapshots"), { json, signal });
  }

  /** The sandbox's snapshots, oldest first. */
  async snapshots(options: SignalOptions = {}): Promise<SnapshotInfo[]> {
    return (await this.transport.call<SnapshotInfo[] | null>("GET", this.path("/snapshots"), { idempotent: true, signal: options.signal })) ?? [];
  }

  /**
   * Gives the sandbox the files of one of its snapshots (an id, a unique
   * prefix, or a name): a running sandbox is stopped (as stop(), with
   * timeoutSeconds), gets a copy of them and runs again; a stopped one
   * stays stopped. The snapshot's processes are its history (forked_from).
   * Resolves to its description (kept in info).
   */
  async rollback(snapshot: string, options: { timeoutSeconds?: number } & SignalOptions = {}, ...extra: never[]): Promise<SandboxInfo> {
    noMore(extra, "rollback()");
    checkOptions(options, ["timeoutSeconds", "signal"], "rollback()");
    checkSignal(options.signal, "rollback()");
    if (typeof snapshot !== "string" || snapshot === "") throw new SandkilnError("INVALID_ARGUMENT", "rollback(): a snapshot is needed");
    const timeout = stopTimeout(options.timeoutSeconds, "rollback()");
    this.info = await this.transport.call<SandboxInfo>("POST", this.path("/rollback"), {
      query: { timeout }, json: { snapshot }, signal: options.signal,
      timeoutMs: CONTROL_TIMEOUT_MS + (timeout ?? DEFAULT_STOP_TIMEOUT_SECONDS) * 1000,
    });
    return this.info;
  }

  /**
   * Makes count sandboxes (default 1, at most 64) with the sandbox's files
   * as they are now, and its image, limits, runtime, network policy,
   * init command and labels (labels added). A running gVisor sandbox's
   * processes go on in each fork where they were, unless filesOnly. All
   * are made, or none.
   */
  async fork(options: { count?: number; labels?: Record<string, string>; filesOnly?: boolean } & SignalOptions = {}, ...extra: never[]): Promise<Sandbox[]> {
    noMore(extra, "fork()");
    checkOptions(options, ["count", "labels", "filesOnly", "signal"], "fork()");
    checkSignal(options.signal, "fork()");
    const { signal, filesOnly, ...rest } = options;
    const json = filesOnly === undefined ? rest : { ...rest, files_only: filesOnly };
    const out = await this.transport.call<Schemas["Forked"]>("POST", this.path("/fork"), { json, signal });
    return out.sandboxes.map((info) => this.registry.handle(info));
  }

  /**
   * Pauses the sandbox, as docker pause does: its every process stops
   * where it is, its memory kept, and uses no CPU until resume().
   * Meanwhile what needs it to run (exec, a process started, stdin, its
   * files and ports) is PAUSED; its processes' output stays readable and
   * their watchers attached, reading on at the same offsets after the
   * resume. Resolves to its description, paused (state "paused"); one
   * paused already is left as it is (kilnd answers 304 Not Modified).
   */
  async pause(options: SignalOptions = {}, ...extra: never[]): Promise<SandboxInfo> {
    noMore(extra, "pause()");
    checkOptions(options, ["signal"], "pause()");
    return this.change("pause", undefined, true, options.signal);
  }

  /**
   * Resumes a paused sandbox, as docker unpause does: its processes run on
   * from where they were. Resolves to its description, running; one that
   * is not paused is left as it is (kilnd answers 304 Not Modified).
   */
  async resume(options: SignalOptions = {}, ...extra: never[]): Promise<SandboxInfo> {
    noMore(extra, "resume()");
    checkOptions(options, ["signal"], "resume()");
    return this.change("resume", undefined, true, options.signal);
  }

  /** A stop, start, restart, pause or resume (verb): its answer, or after a 304 the sandbox as it is. */
  private async change(verb: string, timeout: number | undefined, idempotent: boolean, signal: AbortSignal | undefined): Promise<SandboxInfo> {
    checkSignal(signal, `${verb}()`);
    const resp = await this.transport.fetch("POST", this.path("/" + verb), {
      query: { timeout },
      idempotent,
      signal,
      // kilnd answers once the stop's grace is over, at the latest.
      timeoutMs: CONTROL_TIMEOUT_MS + (timeout ?? DEFAULT_STOP_TIMEOUT_SECONDS) * 1000,
      isError: (r) => r.status >= 300 && r.status !== 304,
    });
    if (resp.status === 304) return this.refresh({ signal });
    try {
      this.info = (await resp.json()) as SandboxInfo;
    } catch (err) {
      if (!idempotent) {
        throw new SandkilnError("OUTCOME_UNKNOWN", `POST ${this.path("/" + verb)}: reading the answer: ${String(err)}`, { cause: err });
      }
      throw new SandkilnError("UNAVAILABLE", `POST ${this.path("/" + verb)}: reading the answer: ${String(err)}`, { cause: err });
    }
    return this.info;
  }

  /**
   * Deletes the sandbox: its processes are killed; its captured logs stay
   * unless removeLogs. Handles of it made through this client refuse
   * further requests, those made through another Sandbox of the same id
   * (client.sandboxes.get() again) among them.
   */
  async destroy(options: { removeLogs?: boolean } & SignalOptions = {}, ...extra: never[]): Promise<void> {
    noMore(extra, "destroy()");
    checkOptions(options, ["removeLogs", "signal"], "destroy()");
    checkSignal(options.signal, "destroy()"); // aborted already: nothing is let go, nothing deleted
    this.registry.letGo(this.id);
    try {
      await this.transport.call("DELETE", this.path(""), {
        query: { remove_logs: options.removeLogs ? true : undefined }, idempotent: true, signal: options.signal,
      });
    } catch (err) {
      if (err instanceof SandkilnError && err.code === "NOT_FOUND") return;
      throw err;
    }
  }

  /**
   * Runs a command to its end and returns its output (at most
   * maxOutputBytes, default and ceiling 1 MiB, kept; the totals say how
   * much there was). With onOutput, the output's text is given to it as it
   * comes, each call awaited, and the exact bytes are kept from the same
   * run; the command is never run twice.
   */
  async exec(input: ExecInput, options: ExecOptions = {}, ...extra: never[]): Promise<ExecOutput> {
    noMore(extra, "exec()");
    checkOptions(input, ["command", "cwd", "env", "user", "stdin", "maxOutputBytes", "deadlineSeconds"], "exec()");
    checkOptions(options, ["onOutput", "signal"], "exec() options");
    if (input === undefined) throw new SandkilnError("INVALID_ARGUMENT", "exec(): a command is needed");
    const argv = argvOf(input.command);
    if (input.deadlineSeconds !== undefined && options.onOutput) {
      throw new SandkilnError("INVALID_ARGUMENT", "exec with onOutput has no deadline: pass a signal to bound the wait");
    }
    if (input.deadlineSeconds !== undefined && !(typeof input.deadlineSeconds === "number" && input.deadlineSeconds > 0 && input.deadlineSeconds <= MAX_DEADLINE_SECONDS)) {
      throw new SandkilnError("INVALID_ARGUMENT", `deadlineSeconds ${input.deadlineSeconds}: want more than 0, at most ${MAX_DEADLINE_SECONDS}`);
    }
    if (options.onOutput !== undefined && typeof options.onOutput !== "function") {
      throw new SandkilnError("INVALID_ARGUMENT", "exec(): onOutput must be a function");
    }
    const max = maxOutput(input.maxOutputBytes, "maxOutputBytes");
    checkSignal(options.signal, "exec()");
    if (!options.onOutput) return this.execFinite(input, argv, max, options.signal);
    return this.execLive(input, argv, max, options.onOutput, options.signal);
  }

  private async execFinite(input: ExecInput, argv: string[], max: number, signal: AbortSignal | undefined): Promise<ExecOutput> {
    if (input.stdin !== undefined) {
      // A finite exec has no stdin; a live one does.
      return this.execLive(input, argv, max, async () => {}, signal);
    }
    const deadline = input.deadlineSeconds;
    const r = await this.transport.call<Schemas["ExecResult"]>("POST", this.path("/exec"), {
      json: {
        command: argv[0], args: argv.slice(1), env: input.env, cwd: input.cwd, user: input.user, max_output_bytes: max,
        timeout_ms: deadline ? Math.round(deadline * 1000) : undefined,
      },
      signal, unbounded: true,
    });
    return {
      ...exitOf(r),
      stdout: r.stdout ?? "",
      stderr: r.stderr ?? "",
      stdoutBytes: r.stdout_bytes ?? 0,
      stderrBytes: r.stderr_bytes ?? 0,
      truncated: r.truncated ?? false,
      timedOut: r.timed_out ?? false,
    };
  }

  private async execLive(input: ExecInput, argv: string[], max: number,
    onOutput: (chunk: { stream: "stdout" | "stderr"; text: string }) => unknown, signal: AbortSignal | undefined): Promise<ExecOutput> {
    const stdin = input.stdin === undefined ? undefined : typeof input.stdin === "string" ? new TextEncoder().encode(input.stdin) : input.stdin;
    const child = await this.processes.start({
      command: { kind: "argv", argv }, env: input.env, cwd: input.cwd, user: input.user,
      stdin: stdin ? "pipe" : "closed", output: { mode: "stream", format: "bytes" }, signal,
    });
    const kept: Record<"stdout" | "stderr", Uint8Array[]> = { stdout: [], stderr: [] };
    const totals = { stdout: 0, stderr: 0 };
    let keptBytes = 0;
    let truncated = false;
    const decoders = { stdout: new StreamDecoder(), stderr: new StreamDecoder() };
    const result = (exit: Exit | undefined): ExecOutput => ({
      ...(exit ?? { exitCode: null, signal: null, oomKilled: false, outputCut: null }),
      stdout: new TextDecoder().decode(concat(kept.stdout)),
      stderr: new TextDecoder().decode(concat(kept.stderr)),
      stdoutBytes: totals.stdout, stderrBytes: totals.stderr, truncated, timedOut: false,
    });
    try {
      const feeding = (async () => {
        if (!stdin) return;
        for (let i = 0; i < stdin.length; i += LIMITS.maxWriteBytes) {
          await child.write(stdin.subarray(i, i + LIMITS.maxWriteBytes), { signal });
        }
        await child.closeStdin({ signal });
      })();
      try {
        for await (const chunk of child.output({ signal })) {
          const s = chunk.stream as "stdout" | "stderr";
          totals[s] += chunk.bytes.length;
          const room = max - keptBytes;
          if (chunk.bytes.length > room) truncated = true;
          if (room > 0) {
            const piece = chunk.bytes.subarray(0, room);
            kept[s].push(piece);
            keptBytes += piece.length;
          }
          const text = decoders[s].decode(chunk.bytes);
          if (text) await onOutput({ stream: s, text });
        }
        for (const s of ["stdout", "stderr"] as const) {
          const text = decoders[s].flush();
          if (text) await onOutput({ stream: s, text });
        }
      } catch (err) {
        let exit: Exit | undefined;
        try {
          const st = await child.status();
          exit = st.exit;
        } catch {
          // the exit stays unconfirmed
        }
        if (err instanceof SandkilnError && err.code !== "INTERNAL") {
          throw new SandkilnError(err.code, err.message, { cause: err, confirmedExit: exit, output: result(exit) });
        }
        throw new SandkilnError("INTERNAL", `exec: the output callback failed: ${message(err)}`, {
          cause: err, confirmedExit: exit, output: result(exit),
        });
      }
      await feeding;
      const exit = await child.wait({ signal });
      return result(exit);
    } finally {
      await child.detach();
    }
  }
}

/** The longest deadline an exec takes: kilnd's bound on timeout_ms. */
const MAX_DEADLINE_SECONDS = 7 * 24 * 60 * 60;

/** Checks a finite output bound (default 1 MiB). */
function maxOutput(v: unknown, what: string): number {
  const max = v ?? LIMITS.maxFiniteOutput;
  if (typeof max !== "number" || !Number.isInteger(max) || max < 1 || max > LIMITS.maxFiniteOutput) {
    throw new SandkilnError("INVALID_ARGUMENT", `${what} ${String(v)}: want an integer from 1 to ${LIMITS.maxFiniteOutput}`);
  }
  return max;
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** A command: an argv run directly, or a shell script (/bin/sh -c). */
export type Command = { kind: "argv"; argv: string[] } | { kind: "shell"; script: string };

function argvOf(c: Command | undefined): string[] {
  if (c?.kind === "argv" && Array.isArray(c.argv) && c.argv.length > 0 && c.argv.every((a) => typeof a === "string")) return c.argv;
  if (c?.kind === "shell" && typeof c.script === "string") return ["/bin/sh", "-c", c.script];
  throw new SandkilnError("INVALID_ARGUMENT", 'command: want { kind: "argv", argv: [program, ...args] } or { kind: "shell", script }');
}

export interface ExecInput {
  command: Command;
  cwd?: string;
  env?: Record<string, string>;
  user?: string;
  /** Input, written then closed. */
  stdin?: string | Uint8Array;
  /** Output kept, both streams together: 1 to 1 MiB (the default). */
  maxOutputBytes?: number;
  /** Ordinary exec only: kill the command after this long. */
  deadlineSeconds?: number;
}

export interface ExecOptions extends SignalOptions {
  onOutput?: (chunk: { stream: "stdout" | "stderr"; text: string }) => unknown;
}

export interface ExecOutput extends Omit<Exit, "exitCode"> {
  /** The exit code (see Exit); null only in the output a failed exec's error carries, when no exit was confirmed. */
  exitCode: number | null;
  stdout: string;
  stderr: string;
  stdoutBytes: number;
  stderrBytes: number;
  /** Output beyond maxOutputBytes was not kept, or was lost before it was read. */
  truncated: boolean;
  timedOut: boolean;
}

export interface StartOptions extends SignalOptions {
  command: Command;
  cwd?: string;
  env?: Record<string, string>;
  /** A user of the sandbox's: NAME, UID, NAME:GROUP or UID:GID. */
  user?: string;
  /** "pipe" for write() and closeStdin(); "closed" (the default) for none. */
  stdin?: "pipe" | "closed";
  output?: {
    /** "stream" for long-running work; "finite" (the default) keeps at most maxOutputBytes. */
    mode?: "stream" | "finite";
    format?: "text" | "bytes";
    /** Finite mode's bound, 1 to 1 MiB (the default); not with mode "stream". */
    maxOutputBytes?: number;
    /** Bytes lost to this handle: the output fails with OUTPUT_CAPACITY ("fail", the default), or a chunk with lost says how many and the output goes on ("report"). */
    overflow?: "fail" | "report";
    /**
     * "block" (the default): the process waits for this handle's reader
     * when it falls behind, as a program waits for its terminal, so that
     * a reader loses nothing; it stops waiting once the handle stops
     * reading (leaves its output loop, detaches, or waits for the exit
     * without reading). "drop": the process never waits; what the reader
     * falls behind on may be lost (see overflow).
     */
    flow?: "drop" | "block";
  };
  /** Keep the output durably in the sandbox's captured logs. */
  capture?: boolean;
  /** How long, in ms, the output is read after the process exits while something it left behind holds it open (default 3000, at most 60000); past it the output is cut, and the exit says outputCut. */
  drainMs?: number;
}

type TextStart = StartOptions & { output?: { format?: "text" } };
type ByteStart = StartOptions & { output: { format: "bytes" } };

const START_OPTIONS = ["command", "cwd", "env", "user", "stdin", "output", "capture", "drainMs", "signal", "deadlineSeconds"] as const;
const OUTPUT_OPTIONS = ["mode", "format", "maxOutputBytes", "overflow", "flow"] as const;

function settingsOf(o: StartOptions, terminal: boolean): HandleSettings {
  checkOptions(o, START_OPTIONS, terminal ? "terminals.start()" : "processes.start()");
  if (o === undefined) throw new SandkilnError("INVALID_ARGUMENT", "processes.start(): a command is needed");
  const out = checkOptions(o.output, OUTPUT_OPTIONS, "output");
  const mode = out.mode ?? "finite";
  if (mode !== "stream" && mode !== "finite") throw new SandkilnError("INVALID_ARGUMENT", `output.mode ${JSON.stringify(mode)}: want "stream" or "finite"`);
  const format = terminal ? "bytes" : out.format ?? "text";
  if (format !== "text" && format !== "bytes") throw new SandkilnError("INVALID_ARGUMENT", `output.format ${JSON.stringify(format)}: want "text" or "bytes"`);
  if (mode === "stream" && out.maxOutputBytes !== undefined) {
    throw new SandkilnError("INVALID_ARGUMENT", "output.maxOutputBytes belongs to finite mode, not stream mode");
  }
  const max = maxOutput(out.maxOutputBytes, "output.maxOutputBytes");
  const overflow = out.overflow ?? "fail";
  if (overflow !== "fail" && overflow !== "report") throw new SandkilnError("INVALID_ARGUMENT", `output.overflow ${JSON.stringify(overflow)}: want "fail" or "report"`);
  const flow = out.flow ?? "block";
  if (flow !== "block" && flow !== "drop") throw new SandkilnError("INVALID_ARGUMENT", `output.flow ${JSON.stringify(flow)}: want "block" or "drop"`);
  if ((o as { deadlineSeconds?: unknown }).deadlineSeconds !== undefined) {
    throw new SandkilnError("INVALID_ARGUMENT", "processes.start() cannot guarantee a runtime deadline: it takes no deadlineSeconds; terminate() it instead");
  }
  if (o.stdin !== undefined && o.stdin !== "pipe" && o.stdin !== "closed") {
    throw new SandkilnError("INVALID_ARGUMENT", `stdin ${JSON.stringify(o.stdin)}: want "pipe" or "closed"`);
  }
  if (o.drainMs !== undefined && !(Number.isInteger(o.drainMs) && o.drainMs >= 0 && o.drainMs <= 60_000)) {
    throw new SandkilnError("INVALID_ARGUMENT", `drainMs ${o.drainMs}: want an integer from 0 to 60000`);
  }
  checkSignal(o.signal, terminal ? "terminals.start()" : "processes.start()");
  return { format, mode, maxOutputBytes: max, overflow, hold: flow === "block", terminal, stdinPipe: terminal || o.stdin === "pipe" };
}

/** Starts a process and resolves with its id, once kilnd has it; a lost answer is OUTCOME_UNKNOWN (never started again). */
async function startOn(s: Sandbox, o: StartOptions, settings: HandleSettings, tty?: { cols: number; rows: number }): Promise<string> {
  const argv = argvOf(o.command);
  const st = await s.transport.call<{ id: string }>("POST", s.path("/exec-stream"), {
    json: {
      command: argv[0], args: argv.slice(1), env: o.env, cwd: o.cwd, user: o.user,
      stdin: settings.stdinPipe ? "pipe" : undefined, tty, capture: o.capture || undefined,
      flow: settings.hold ? "block" : undefined, drain_ms: o.drainMs || undefined,
    },
    signal: o.signal,
  });
  return st.id;
}

/** Refuses a reference that is not one of kind this SDK makes, of this sandbox, still valid. */
function checkReference(s: Sandbox, ref: ProcessReference, kind: ProcessReference["kind"]): void {
  const bad = (why: string) => new SandkilnError("INVALID_ARGUMENT", `not a ${kind} reference: ${why}`);
  if (!ref || typeof ref !== "object") throw bad("not an object");
  if (ref.version !== 1) throw bad(`version ${JSON.stringify(ref.version)}`);
  if (ref.kind !== kind) throw bad(`it is a ${JSON.stringify(ref.kind)} reference`);
  if (typeof ref.process !== "string" || ref.process === "") throw bad("no process");
  if (ref.sandbox !== s.id) throw new SandkilnError("INVALID_ARGUMENT", `the reference is of sandbox ${ref.sandbox}, not ${s.id}`);
  // The settings it records are the handle's: ones no handle has are refused, not guessed at.
  if (ref.format !== "text" && ref.format !== "bytes") throw bad(`format ${JSON.stringify(ref.format)}`);
  if (kind === "terminal" && ref.format !== "bytes") throw bad("a terminal's output is bytes");
  if (ref.mode !== "stream" && ref.mode !== "finite") throw bad(`mode ${JSON.stringify(ref.mode)}`);
  if (ref.overflow !== "report" && ref.overflow !== "fail") throw bad(`overflow ${JSON.stringify(ref.overflow)}`);
  if (typeof ref.hold !== "boolean") throw bad("hold");
  if (!Number.isInteger(ref.maxOutputBytes) || ref.maxOutputBytes < 1 || ref.maxOutputBytes > LIMITS.maxFiniteOutput) throw bad("maxOutputBytes");
  const st = ref.stdin;
  if (!st || typeof st.pipe !== "boolean" || typeof st.closed !== "boolean" || !Number.isInteger(st.offset) || st.offset < 0) throw bad("stdin");
  for (const m of [ref.offsets, ref.lost]) {
    if (!m || typeof m !== "object" || Object.values(m).some((v) => !Number.isInteger(v) || v < 0)) throw bad("offsets");
  }
  if (!ref.ended || typeof ref.ended !== "object") throw bad("ended");
  const expires = Date.parse(ref.expiresAt);
  if (!(expires > Date.now())) throw new SandkilnError("FAILED_PRECONDITION", `the reference expired at ${ref.expiresAt}`);
  // A reference lives 24 hours at most; one that says longer was not made by reference().
  if (expires > Date.now() + LIMITS.referenceLifetimeMs + 60_000) throw bad(`it says it expires at ${ref.expiresAt}, beyond 24 hours`);
}

/** Refuses a reference whose settings the process does not have, or whose offsets it never reached. */
function checkAgainst(ref: ProcessReference, p: Schemas["Process"]): void {
  const terminal = p.terminal ?? false;
  if (terminal !== (ref.kind === "terminal")) {
    throw new SandkilnError("INVALID_ARGUMENT", `process ${ref.process} is ${terminal ? "" : "not "}a terminal; the reference says otherwise`);
  }
  if (!terminal && ref.stdin.pipe !== (p.stdin !== undefined)) {
    throw new SandkilnError("INVALID_ARGUMENT", `process ${ref.process} ${p.stdin ? "has" : "has no"} stdin pipe; the reference says otherwise`);
  }
  for (const [stream, at] of Object.entries(ref.offsets)) {
    const total = p.streams?.[stream]?.total_bytes;
    if (total === undefined) throw new SandkilnError("INVALID_ARGUMENT", `process ${ref.process} has no stream ${stream}`);
    if (at > total) throw new SandkilnError("OUT_OF_RANGE", `the reference stands at ${at} bytes of ${stream}; process ${ref.process} wrote ${total}`);
  }
  if (ref.stdin.pipe && p.stdin && ref.stdin.offset > p.stdin.accepted) {
    throw new SandkilnError("OUT_OF_RANGE", `the reference wrote ${ref.stdin.offset} bytes of input; kilnd accepted ${p.stdin.accepted}`);
  }
}

export class Processes {
  private readonly s: Sandbox;

  /** @internal */
  constructor(s: Sandbox) {
    this.s = s;
  }

  /** Starts a process and returns its handle at once. */
  start(options: ByteStart, ...extra: never[]): Promise<ProcessHandle<ByteChunk>>;
  start(options: TextStart, ...extra: never[]): Promise<ProcessHandle<TextChunk>>;
  async start(options: StartOptions, ...extra: never[]): Promise<ProcessHandle<Chunk>> {
    noMore(extra, "processes.start()");
    const settings = settingsOf(options, false);
    const id = await startOn(this.s, options, settings);
    return this.s.adopt(new ProcessHandle<Chunk>(this.s, id, settings));
  }

  /**
   * Returns to the process of a reference: its output resumes where the
   * reference stood, a gap reported only for bytes lost since (with
   * their count). It never starts a process.
   */
  async reopen(ref: ProcessReference, options: SignalOptions = {}, ...extra: never[]): Promise<ProcessHandle<Chunk>> {
    noMore(extra, "processes.reopen()");
    const { signal } = checkOptions(options, SIGNAL_ONLY, "processes.reopen()");
    checkReference(this.s, ref, "process");
    checkSignal(signal, "processes.reopen()");
    const p = await this.s.transport.call<Schemas["Process"]>("GET", this.s.path(`/exec-stream/${encodeURIComponent(ref.process)}`), { idempotent: true, signal });
    checkAgainst(ref, p);
    return this.s.adopt(new ProcessHandle<Chunk>(this.s, ref.process, settingsFrom(ref), ref));
  }

  /**
   * A handle on a process of the sandbox's, by its id (one another client
   * started, say), its output read from the beginning (what kilnd still
   * has of it). It does not hold the process's output: what kilnd cannot
   * keep while its reader is behind is lost to it (see overflow). A
   * terminal's handle is a TerminalHandle.
   */
  async get(id: string, options: { format?: "text" | "bytes"; overflow?: "fail" | "report" } & SignalOptions = {}, ...extra: never[]): Promise<ProcessHandle<Chunk> | TerminalHandle> {
    noMore(extra, "processes.get()");
    const o = checkOptions(options, ["format", "overflow", "signal"], "processes.get()");
    if (typeof id !== "string" || id === "") throw new SandkilnError("INVALID_ARGUMENT", "processes.get(): a process id is needed");
    if (o.format !== undefined && o.format !== "text" && o.format !== "bytes") throw new SandkilnError("INVALID_ARGUMENT", `format ${JSON.stringify(o.format)}: want "text" or "bytes"`);
    if (o.overflow !== undefined && o.overflow !== "fail" && o.overflow !== "report") throw new SandkilnError("INVALID_ARGUMENT", `overflow ${JSON.stringify(o.overflow)}: want "fail" or "report"`);
    checkSignal(o.signal, "processes.get()");
    const p = await this.s.transport.call<Schemas["Process"]>("GET", this.s.path(`/exec-stream/${encodeURIComponent(id)}`), {
      idempotent: true, signal: o.signal,
    });
    const terminal = p.terminal ?? false;
    const ref: ProcessReference = {
      kind: terminal ? "terminal" : "process", version: 1, sandbox: this.s.id, process: id, offsets: {}, lost: {}, ended: {},
      stdin: { pipe: p.stdin !== undefined, offset: p.stdin?.accepted ?? 0, closed: p.stdin?.closed ?? true },
      format: terminal ? "bytes" : o.format ?? "text", mode: "stream", maxOutputBytes: LIMITS.maxFiniteOutput,
      overflow: terminal ? "fail" : o.overflow ?? "fail", hold: false, expiresAt: new Date(Date.now() + LIMITS.referenceLifetimeMs).toISOString(),
    };
    const settings = settingsFrom(ref);
    return this.s.adopt(terminal ? new TerminalHandle(this.s, id, settings, ref) : new ProcessHandle<Chunk>(this.s, id, settings, ref));
  }

  /** The sandbox's processes, running and finished. */
  async list(options: SignalOptions = {}, ...extra: never[]): Promise<Schemas["Process"][]> {
    noMore(extra, "processes.list()");
    const { signal } = checkOptions(options, SIGNAL_ONLY, "processes.list()");
    checkSignal(signal, "processes.list()");
    return (await this.s.transport.call<Schemas["Process"][] | null>("GET", this.s.path("/exec-stream"), { idempotent: true, signal })) ?? [];
  }
}

function settingsFrom(ref: ProcessReference): HandleSettings {
  return {
    format: ref.format, mode: ref.mode, maxOutputBytes: ref.maxOutputBytes, overflow: ref.overflow, hold: ref.hold,
    terminal: ref.kind === "terminal", stdinPipe: ref.stdin.pipe,
  };
}

export interface TerminalStartOptions extends SignalOptions {
  command: Command;
  columns?: number;
  rows?: number;
  cwd?: string;
  env?: Record<string, string>;
  user?: string;
  capture?: boolean;
  /** As StartOptions' drainMs. */
  drainMs?: number;
}

const TERMINAL_OPTIONS = ["command", "columns", "rows", "cwd", "env", "user", "capture", "drainMs", "signal"] as const;

export class Terminals {
  private readonly s: Sandbox;

  /** @internal */
  constructor(s: Sandbox) {
    this.s = s;
  }

  /**
   * Starts a program on a terminal (80x24 unless said). The program
   * waits for this handle's reader when it falls behind, as one waits for
   * a real terminal, until the handle stops reading.
   */
  async start(options: TerminalStartOptions, ...extra: never[]): Promise<TerminalHandle> {
    noMore(extra, "terminals.start()");
    checkOptions(options, TERMINAL_OPTIONS, "terminals.start()");
    if (options === undefined) throw new SandkilnError("INVALID_ARGUMENT", "terminals.start(): a command is needed");
    const columns = options.columns ?? 80;
    const rows = options.rows ?? 24;
    checkSize(columns, rows);
    const { columns: _c, rows: _r, ...rest } = options;
    const settings = settingsOf({ ...rest, stdin: "pipe", output: { mode: "stream", format: "bytes" } }, true);
    const id = await startOn(this.s, rest, settings, { cols: columns, rows });
    return this.s.adopt(new TerminalHandle(this.s, id, settings));
  }

  /** Returns to a terminal of a reference, as processes.reopen does. */
  async reopen(ref: ProcessReference, options: SignalOptions = {}, ...extra: never[]): Promise<TerminalHandle> {
    noMore(extra, "terminals.reopen()");
    const { signal } = checkOptions(options, SIGNAL_ONLY, "terminals.reopen()");
    checkReference(this.s, ref, "terminal");
    checkSignal(signal, "terminals.reopen()");
    const p = await this.s.transport.call<Schemas["Process"]>("GET", this.s.path(`/exec-stream/${encodeURIComponent(ref.process)}`), { idempotent: true, signal });
    checkAgainst(ref, p);
    return this.s.adopt(new TerminalHandle(this.s, ref.process, settingsFrom(ref), ref));
  }
}

function filePath(p: string): string {
  if (!p.startsWith("/")) throw new SandkilnError("INVALID_ARGUMENT", `path ${JSON.stringify(p)}: want an absolute path in the sandbox`);
  const segs = p.split("/").filter((x) => x !== "");
  return "/files/" + segs.map(encodeURIComponent).join("/");
}

/** A sandbox's files, read and written by its root, confined as its processes are. */
export class Files {
  private readonly s: Sandbox;

  /** @internal */
  constructor(s: Sandbox) {
    this.s = s;
  }

  /** A file's content. */
  async read(path: string, options: SignalOptions = {}): Promise<Uint8Array> {
    const resp = await this.s.transport.fetch("GET", this.s.path(filePath(path)), { idempotent: true, unbounded: true, signal: options.signal });
    if (resp.headers.get("content-type")?.startsWith("application/json")) {
      throw new SandkilnError("INVALID_ARGUMENT", `${path} is a directory: use files.list`);
    }
    return new Uint8Array(await resp.arrayBuffer());
  }

  /** A file's content as UTF-8 text. */
  async readText(path: string, options: SignalOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(path, options));
  }

  /** Writes a file whole (its parent directories made). */
  async write(path: string, data: string | Uint8Array, options: { mode?: string } & SignalOptions = {}): Promise<FileInfo> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    return this.s.transport.call<FileInfo>("PUT", this.s.path(filePath(path)), {
      bytes, query: { mode: options.mode }, idempotent: true, unbounded: true, signal: options.signal,
    });
  }

  /** A directory's entries. */
  async list(path: string, options: SignalOptions = {}): Promise<FileInfo[]> {
    const got = await this.s.transport.call<FileInfo[] | FileInfo>("GET", this.s.path(filePath(path) + "/"), { idempotent: true, signal: options.signal });
    if (!Array.isArray(got)) throw new SandkilnError("INVALID_ARGUMENT", `${path} is not a directory`);
    return got;
  }

  /** What the path is (a final link not followed). */
  async stat(path: string, options: SignalOptions = {}): Promise<FileInfo> {
    return this.s.transport.call<FileInfo>("GET", this.s.path(filePath(path)), { query: { stat: true }, idempotent: true, signal: options.signal });
  }

  /** Removes a file or an empty directory; with recursive, a directory and all in it. */
  async remove(path: string, options: { recursive?: boolean } & SignalOptions = {}): Promise<void> {
    await this.s.transport.call("DELETE", this.s.path(filePath(path)), {
      query: { recursive: options.recursive || undefined }, idempotent: true, signal: options.signal,
    });
  }

  /**
   * A tar of path (a directory with all in it, or one file), its entries
   * named from the path's base name, as docker cp gives it, and what the
   * path is. The tar streams as it is read (no local timeout: the signal
   * ends it); a failure of the stream is a SandkilnError.
   */
  async archive(path: string, options: SignalOptions = {}): Promise<{ info: FileInfo; body: ReadableStream<Uint8Array> }> {
    filePath(path);
    const resp = await this.s.transport.fetch("GET", this.s.path("/archive"), {
      query: { path }, idempotent: true, unbounded: true, signal: options.signal,
    });
    let info: FileInfo;
    try {
      info = JSON.parse(resp.headers.get("Kiln-Path-Stat") ?? "") as FileInfo;
    } catch (err) {
      await resp.body?.cancel();
      throw new SandkilnError("INTERNAL", `archive ${path}: kilnd's answer has no Kiln-Path-Stat`, { cause: err });
    }
    return { info, body: guarded(resp.body!, `archive ${path}`, options.signal) };
  }

  /**
   * Extracts a tar into the directory dir, which must exist, and says what
   * dir is then. Its entries belong to the sandbox's root, permissions and
   * times kept (setuid and setgid dropped); absolute names, "..", device
   * nodes and links leading out of dir are refused (PERMISSION_DENIED),
   * what came before them kept. A stream is sent as it is read.
   */
  async extract(dir: string, tar: TarBody, options: SignalOptions = {}): Promise<FileInfo> {
    filePath(dir);
    return this.s.transport.call<FileInfo>("PUT", this.s.path("/archive"), {
      query: { path: dir }, body: tar, contentType: "application/x-tar", idempotent: true, unbounded: true, signal: options.signal,
    });
  }

  /** Makes a directory and its parents. */
  async mkdir(path: string, options: SignalOptions = {}): Promise<FileInfo> {
    return this.s.transport.call<FileInfo>("POST", this.s.path(filePath(path)), { query: { op: "mkdir" }, idempotent: true, signal: options.signal });
  }

  /**
   * Renames from to the absolute path to in one step, as rename(2) in the
   * sandbox does (an existing file there is replaced), and says what it is
   * then.
   */
  async move(from: string, to: string, options: SignalOptions = {}): Promise<FileInfo> {
    filePath(to);
    return this.s.transport.call<FileInfo>("POST", this.s.path(filePath(from)), { query: { op: "move", to }, signal: options.signal });
  }
}

/** Preview URLs: a sandbox's port reached without kilnd's token. */
export class Previews {
  private readonly s: Sandbox;

  /** @internal */
  constructor(s: Sandbox) {
    this.s = s;
  }

  /** A preview of the port; its url (and token) are given this once. Starting a server does not publish its port: this does. */
  async create(options: { port: number; ttlSeconds?: number } & SignalOptions): Promise<Preview> {
    return this.s.transport.call<Preview>("POST", this.s.path("/previews"), {
      json: { port: options.port, ttl_seconds: options.ttlSeconds }, signal: options.signal,
    });
  }

  async list(options: SignalOptions = {}): Promise<Preview[]> {
    return (await this.s.transport.call<Preview[] | null>("GET", this.s.path("/previews"), { idempotent: true, signal: options.signal })) ?? [];
  }

  async revoke(id: string, options: SignalOptions = {}): Promise<void> {
    await this.s.transport.call("DELETE", this.s.path(`/previews/${encodeURIComponent(id)}`), { idempotent: true, signal: options.signal });
  }
}

/** kilnd's snapshots (Sandbox.snapshot() takes them). */
export class Snapshots {
  private readonly t: Transport;

  /** @internal */
  constructor(t: Transport) {
    this.t = t;
  }

  /** The snapshots, oldest first; of one sandbox (an id, a unique prefix or a name) when sandbox is set. */
  async list(options: { sandbox?: string } & SignalOptions = {}): Promise<SnapshotInfo[]> {
    checkOptions(options, ["sandbox", "signal"], "snapshots.list()");
    return (await this.t.call<SnapshotInfo[] | null>("GET", "/snapshots", { query: { sandbox: options.sandbox }, idempotent: true, signal: options.signal })) ?? [];
  }

  /** A snapshot, by id, a unique prefix of it, or its name. */
  async get(ref: string, options: SignalOptions = {}): Promise<SnapshotInfo> {
    return this.t.call<SnapshotInfo>("GET", "/snapshots/" + encodeURIComponent(ref), { idempotent: true, signal: options.signal });
  }

  /** Removes a snapshot; the sandboxes made from it keep their files. */
  async remove(ref: string, options: SignalOptions = {}): Promise<void> {
    await this.t.call("DELETE", "/snapshots/" + encodeURIComponent(ref), { idempotent: true, signal: options.signal });
  }

  /**
   * A snapshot as a tar, streamed as it is read, for import() on another
   * kilnd; a stream that ends in an error is an export that failed.
   */
  async export(ref: string, options: SignalOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const resp = await this.t.fetch("GET", "/snapshots/" + encodeURIComponent(ref) + "/export", { idempotent: true, unbounded: true, signal: options.signal });
    return guarded(resp.body!, `export ${ref}`, options.signal);
  }

  /**
   * Takes a snapshot from the tar export() gave, whole or not at all, with
   * its id and name (ALREADY_EXISTS when either is taken here). A sandbox
   * made from it needs its image here.
   */
  async import(tar: TarBody, options: SignalOptions = {}): Promise<SnapshotInfo> {
    return this.t.call<SnapshotInfo>("POST", "/snapshots/import", { body: tar, contentType: "application/x-tar", unbounded: true, signal: options.signal });
  }
}

/**
 * The nodes of kilnd's cluster (kilnd --cluster): any node answers for
 * all of them. A kilnd in no cluster rejects with FAILED_PRECONDITION.
 */
export class Nodes {
  private readonly t: Transport;

  /** @internal */
  constructor(t: Transport) {
    this.t = t;
  }

  /** The nodes by name, each as its last heartbeat told: state, labels, capacity and load; self on the node that answered. */
  async list(options: SignalOptions = {}): Promise<NodeInfo[]> {
    return (await this.t.call<NodeInfo[] | null>("GET", "/nodes", { idempotent: true, signal: options.signal })) ?? [];
  }

  /** A node by name; NOT_FOUND if the cluster has none of that name. */
  async get(name: string, options: SignalOptions = {}): Promise<NodeInfo> {
    return this.t.call<NodeInfo>("GET", nodePath(name), { idempotent: true, signal: options.signal });
  }

  /**
   * Places no new sandbox on the node, as kubectl cordon does: its
   * sandboxes run on and are served as before; creates go to the other
   * nodes (one naming it is FAILED_PRECONDITION). Resolves to the node,
   * draining. Draining twice changes nothing, so a lost answer is
   * UNAVAILABLE, to be asked again. With moveStopped, the node also moves
   * each of its stopped sandboxes to another ready node, as a snapshot of
   * its files, before it answers: the node's moved says where each went,
   * or why not and which snapshot holds its files.
   */
  async drain(name: string, options: SignalOptions & { moveStopped?: boolean } = {}): Promise<NodeInfo> {
    if (options.moveStopped) {
      return this.t.call<NodeInfo>("POST", nodePath(name) + "/drain", { json: { move_stopped: true }, unbounded: true, signal: options.signal });
    }
    return this.t.call<NodeInfo>("POST", nodePath(name) + "/drain", { idempotent: true, signal: options.signal });
  }

  /** Places sandboxes on a drained node again (kubectl uncordon); resolves to the node. */
  async undrain(name: string, options: SignalOptions = {}): Promise<NodeInfo> {
    return this.t.call<NodeInfo>("DELETE", nodePath(name) + "/drain", { idempotent: true, signal: options.signal });
  }
}

function nodePath(name: string): string {
  if (typeof name !== "string" || !name) throw new SandkilnError("INVALID_ARGUMENT", "nodes: a node's name is needed");
  return "/nodes/" + encodeURIComponent(name);
}

/** The OCI images kilnd keeps. */
export class Images {
  private readonly t: Transport;

  /** @internal */
  constructor(t: Transport) {
    this.t = t;
  }

  async list(options: SignalOptions = {}): Promise<ImageInfo[]> {
    return (await this.t.call<ImageInfo[] | null>("GET", "/images", { idempotent: true, signal: options.signal })) ?? [];
  }

  async get(name: string, options: SignalOptions = {}): Promise<ImageInfo> {
    return this.t.call<ImageInfo>("GET", "/images/" + name.split("/").map(encodeURIComponent).join("/"), { idempotent: true, signal: options.signal });
  }

  /**
   * Imports the images of a tar, as docker save or an OCI image layout
   * writes it (for a host without a registry), telling onProgress of each
   * line; resolves with the images imported. A tar kilnd cannot read is
   * INVALID_ARGUMENT.
   */
  async import(tar: TarBody, options: { onProgress?: (p: ImageProgress) => void } & SignalOptions = {}): Promise<ImageInfo[]> {
    const resp = await this.t.fetch("POST", "/images/import", {
      body: tar, contentType: "application/x-tar", idempotent: true, unbounded: true, signal: options.signal,
    });
    for await (const p of ndjson<ImageProgress>(resp.body!, "import", options.signal)) {
      options.onProgress?.(p);
      if (p.status === "error") throw SandkilnError.fromAnswer(200, { error: p.error }, "import");
      if (p.status === "done") return p.images ?? [];
    }
    throw new SandkilnError("UNAVAILABLE", "import: the answer ended before it was done");
  }

  /** Pulls an image, telling onProgress of each step; resolves with the image. */
  async pull(ref: string, options: { onProgress?: (p: Schemas["ImageProgress"]) => void } & SignalOptions = {}): Promise<ImageInfo> {
    const resp = await this.t.fetch("POST", "/images/pull", { json: { ref }, idempotent: true, unbounded: true, signal: options.signal });
    const reader = resp.body!.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (value) buf += value;
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (!line.trim()) continue;
        const p = JSON.parse(line) as Schemas["ImageProgress"];
        options.onProgress?.(p);
        if (p.status === "error") throw SandkilnError.fromAnswer(200, { error: p.error }, `pull ${ref}`);
        if (p.status === "done" && p.images?.[0]) return p.images[0];
      }
      if (done) throw new SandkilnError("UNAVAILABLE", `pull ${ref}: the answer ended before the image`);
    }
  }

  async remove(name: string, options: SignalOptions = {}): Promise<void> {
    await this.t.call("DELETE", "/images/" + name.split("/").map(encodeURIComponent).join("/"), { idempotent: true, signal: options.signal });
  }
}
