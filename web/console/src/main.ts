// kilnd's web console: sandboxes, processes, live logs and terminals, and
// files, through the TypeScript SDK. The token is kept in sessionStorage,
// never in a URL: per origin and per tab, and no page a sandbox serves
// shares kilnd's origin (each preview has a host of its own, and kilnd
// serves none on its own), so none can read it. What is open is kept in
// the URL's fragment, so a reload shows it again.

import "@xterm/xterm/css/xterm.css";
import "./style.css";

import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import {
  Client,
  ProcessHandle,
  SandkilnError,
  TerminalHandle,
  type Chunk,
  type FileInfo,
  type Sandbox,
  type SandboxInfo,
  type WaitResult,
  type wire,
} from "@sandkiln/sdk";

import { EventFeed, type KilnEvent } from "./events";

type Process = wire["schemas"]["Process"];

// The page's policy allows inline styles by nonce alone; the terminal
// writes its styles into style elements it makes, which get the nonce here.
const nonce = (document.querySelector('meta[name="kiln-csp-nonce"]') as HTMLMetaElement | null)?.nonce ?? "";
const createElement = Document.prototype.createElement;
Document.prototype.createElement = function (this: Document, tag: string, options?: ElementCreationOptions) {
  const el = createElement.call(this, tag, options);
  if (nonce && tag.toLowerCase() === "style") el.nonce = nonce;
  return el;
} as typeof createElement;

const TOKEN_KEY = "kiln.token";
/** The most of a log's text kept on the page; older output is let go (and said so). */
const MAX_LOG_CHARS = 4 << 20;
/** The most of the recent events shown; older ones are let go. */
const MAX_EVENTS_SHOWN = 100;

type Child = Node | string | null | undefined | false;

/** An element with attributes and children; text is always text, never markup. */
function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Record<string, string> = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  for (const c of children) if (c) el.append(c);
  return el;
}

function button(label: string, onClick: () => unknown, attrs: Record<string, string> = {}): HTMLButtonElement {
  const b = h("button", { type: "button", ...attrs }, label);
  b.onclick = async () => {
    b.disabled = true;
    try {
      await onClick();
    } catch (err) {
      report(err);
    } finally {
      b.disabled = false;
    }
  };
  return b;
}

const app = document.getElementById("app")!;
const toast = h("div", { id: "toast", role: "alert" });

function report(err: unknown): void {
  const msg = err instanceof SandkilnError ? `${err.code}: ${err.message}` : err instanceof Error ? err.message : String(err);
  toast.textContent = msg;
  toast.hidden = false;
  if (err instanceof SandkilnError && err.code === "UNAUTHENTICATED") logout("the token was refused");
}

/**
 * An id as kiln shows it and takes it: a sandbox id's first 12 hex digits
 * (they are random); an id of another shape, a UUID's last 12 (its first
 * are its time).
 */
function short(id: string): string {
  return /^[0-9a-f]{64}$/.test(id) ? id.slice(0, 12) : id.slice(-12);
}

function exitText(r: { exitCode: number | null; signal: string | null; oomKilled?: boolean }): string {
  if (r.signal) return `process killed by signal ${r.signal}${r.oomKilled ? ": out of memory" : ""}`;
  if (r.exitCode !== null) return `process exited with code ${r.exitCode}`;
  return "process exit unknown";
}

/** kilnd names a signal as kill -l does ("TERM"); the page as the SDK does ("SIGTERM"), in the list as in the log. */
function signalName(s: string | undefined): string | null {
  if (!s) return null;
  return s.startsWith("SIG") ? s : "SIG" + s;
}

// What the URL's fragment keeps: the sandbox and process open.
function place(): { sandbox?: string; process?: string } {
  const q = new URLSearchParams(location.hash.slice(1));
  return { sandbox: q.get("sandbox") ?? undefined, process: q.get("process") ?? undefined };
}

function go(p: { sandbox?: string; process?: string }): void {
  const q = new URLSearchParams();
  if (p.sandbox) q.set("sandbox", p.sandbox);
  if (p.process) q.set("process", p.process);
  history.replaceState(null, "", "#" + q.toString());
}

// ---- log in ----

function login(error?: string): void {
  app.replaceChildren();
  const input = h("input", { type: "password", id: "token", autocomplete: "current-password", placeholder: "kilnd's token", required: "" });
  const form = h("form", { id: "login" },
    h("h1", {}, "sandkiln"),
    h("label", { for: "token" }, "Token (the token file in kilnd's state directory)"),
    input,
    h("button", { type: "submit" }, "Log in"),
    error ? h("p", { class: "error" }, error) : null);
  form.onsubmit = async (ev) => {
    ev.preventDefault();
    const token = input.value.trim();
    const client = new Client({ url: location.origin, token });
    try {
      await client.sandboxes.list();
    } catch (err) {
      login(err instanceof SandkilnError && err.code === "UNAUTHENTICATED" ? "kilnd refused that token" : String(err));
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    main(client, token);
  };
  app.append(form);
  input.focus();
}

function logout(why?: string): void {
  sessionStorage.removeItem(TOKEN_KEY);
  viewer?.close();
  feed?.close();
  feed = undefined;
  login(why);
}

// ---- the main view ----

let viewer: { close(): void } | undefined;
let feed: EventFeed | undefined;

/** A process as the page shows it, and the count of process events applied when it was set. */
interface Shown {
  p: Process;
  at: number;
}

function main(client: Client, token: string): void {
  app.replaceChildren();
  toast.hidden = true;
  feed?.close();
  const sandboxList = h("tbody");
  const sandboxPanel = h("section", { id: "sandbox" });
  const view = h("section", { id: "viewer" });
  const events = eventsPanel();
  app.append(
    h("header", {}, h("h1", {}, "sandkiln"), button("Log out", () => logout())),
    toast,
    h("main", {},
      h("section", { id: "sandboxes" },
        h("h2", {}, "Sandboxes"),
        createForm(client, () => refresh()),
        h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "id"), h("th", {}, "name"), h("th", {}, "state"), h("th", { class: "wide" }, "runtime, image"), h("th", { class: "wide" }, "limits"), h("th", { class: "wide" }, "labels"), h("th", {}))), sandboxList)),
      sandboxPanel,
      view,
      events.panel));
  let open: Sandbox | undefined;
  // The open sandbox's processes, as its list and its process events
  // since tell them. applied counts the process events applied, so that
  // a list read while one came does not undo what it told.
  let procs = new Map<string, Shown>();
  let applied = 0;

  // The sandboxes, read again on each of their events: an event says
  // what changed, the list what each sandbox is now (its runtime, image,
  // limits and labels are not in an event). Reads never overlap, and one
  // begins after the last event that asked for it.
  const listSandboxes = coalesced(async () => {
    const was = open;
    const list = await client.sandboxes.list();
    sandboxList.replaceChildren(...list.map((s) => sandboxRow(s)));
    if (!was || open !== was) return;
    const info = list.find((s) => s.id === was.id);
    if (!info) {
      closeSandbox(); // deleted, by another client or its ttl
      return;
    }
    const st = sandboxPanel.querySelector(".sandbox-state");
    if (st) st.textContent = stateText(info);
  });

  // The open sandbox's processes, read as a whole: when it opens, after
  // the page's own actions, and when events may have been missed.
  const listProcesses = coalesced(async () => {
    const sb = open;
    if (!sb || sandboxPanel.dataset.sandbox !== sb.id) return;
    const mark = applied;
    const list = await sb.processes.list();
    if (open !== sb) return;
    const next = new Map<string, Shown>();
    for (const p of list) {
      const had = procs.get(p.id);
      // An exit told by an event after the list was asked for is newer
      // than the list's "running"; a process never runs again.
      next.set(p.id, had && had.at > mark && had.p.state === "exited" && p.state !== "exited" ? had : { p, at: mark });
    }
    for (const [id, s] of procs) if (s.at > mark && !next.has(id)) next.set(id, s);
    procs = next;
    showProcesses();
  });

  const refresh = async () => {
    await Promise.all([listSandboxes(), listProcesses()]);
  };

  const processEvent = (p: Process) => {
    const had = procs.get(p.id);
    if (had?.p.state === "exited" && p.state !== "exited") return;
    procs.set(p.id, { p, at: ++applied });
    showProcesses();
  };

  feed = new EventFeed(location.origin, token, {
    event(e, live) {
      events.add(e);
      if (!live) return; // before what the page read
      if (e.type === "gap") {
        refresh().catch(report);
        return;
      }
      if (e.type.startsWith("sandbox.")) listSandboxes().catch(report);
      if (open && e.sandbox === open.id) {
        if (e.type === "sandbox.deleted") closeSandbox();
        // Started again: its agent is a new one, with processes of its own.
        else if (e.type === "sandbox.started") listProcesses().catch(report);
        else if (e.process) processEvent(e.process);
      }
    },
    reread: () => refresh().catch(report),
    live: () => events.status("live", "live"),
    down: (why, ms) => events.status("down", `reconnecting in ${ms} ms: ${why}`),
  });

  const closeSandbox = () => {
    open = undefined;
    procs = new Map();
    viewer?.close();
    viewer = undefined;
    sandboxPanel.replaceChildren();
    delete sandboxPanel.dataset.sandbox;
    view.replaceChildren();
    go({});
    for (const tr of sandboxList.querySelectorAll("tr.selected")) tr.classList.remove("selected");
  };

  const sandboxRow = (s: SandboxInfo) => {
    const tr = h("tr", { "data-sandbox": s.id, class: open?.id === s.id ? "selected" : "" },
      h("td", { class: "id", title: s.id }, short(s.id)),
      h("td", { class: "name" }, s.name ?? ""),
      // In a cluster, the node it runs on, under its state: a column of
      // its own would not fit beside the sandbox's panel.
      h("td", { class: "state" }, s.state, s.node ? h("span", { class: "node", title: "its node" }, "on " + s.node) : null),
      h("td", { class: "runtime wide" }, s.runtime + (s.image ? ", " + s.image : "")),
      h("td", { class: "limits wide" }, limitsText(s)),
      h("td", { class: "labels wide" }, Object.entries(s.labels ?? {}).map(([k, v]) => `${k}=${v}`).join(" ")),
      h("td", {},
        button("Open", async () => {
          open = await client.sandboxes.get(s.id);
          go({ sandbox: s.id });
          await showSandbox(open);
        }),
        // As docker pause and unpause: its processes stop where they
        // are, and run on from there.
        s.state === "running" && button("Pause", async () => {
          await (await client.sandboxes.get(s.id)).pause();
          await listSandboxes();
        }),
        s.state === "paused" && button("Resume", async () => {
          await (await client.sandboxes.get(s.id)).resume();
          await listSandboxes();
        }),
        // Its files as they are now: a snapshot to roll back to or make
        // sandboxes from (kiln snapshot), and a fork (kiln fork).
        // Not of a sandbox whose node is unreachable or lost.
        (s.state === "running" || s.state === "paused" || s.state === "stopped") && button("Snapshot", async () => {
          await (await client.sandboxes.get(s.id)).snapshot();
          await listSandboxes();
        }),
        (s.state === "running" || s.state === "stopped") && button("Fork", async () => {
          await (await client.sandboxes.get(s.id)).fork();
          await listSandboxes();
        }),
        button("Delete", async () => {
          if (open?.id === s.id) closeSandbox();
          await (await client.sandboxes.get(s.id)).destroy();
          await listSandboxes();
        })));
    return tr;
  };

  const showProcesses = () => {
    const sb = open;
    const body = sandboxPanel.querySelector("#processes tbody");
    if (!sb || !body) return;
    body.replaceChildren(...[...procs.values()].map(({ p }) => processRow(sb, p)));
  };

  const processRow = (sb: Sandbox, p: Process) => h("tr", { "data-process": p.id, "data-state": p.state },
    h("td", { class: "id wide", title: p.id }, short(p.id)),
    h("td", { class: "command" }, [p.command, ...(p.args ?? [])].join(" ").replace(/[\n\r]/g, "⏎")),
    h("td", { class: "state" }, p.state === "exited" ? "exited" : p.terminal ? "running (terminal)" : "running"),
    h("td", { class: "exit", title: p.state === "exited" ? exitText(processExit(p)) : "" }, exitCell(p)),
    h("td", { class: "bytes" }, ...streamCells(p)),
    h("td", {},
      button(p.terminal ? "Open" : "Logs", () => openProcess(sb, p.id)),
      p.state === "running" && button("TERM", async () => withHandle(sb, p.id, (hd) => hd.signal("SIGTERM"))),
      p.state === "running" && button("Kill", async () => withHandle(sb, p.id, (hd) => hd.terminate()))));

  /** Opens sb's panel: what it is, and its processes. */
  const showSandbox = async (sb: Sandbox) => {
    const info = await sb.refresh();
    if (open !== sb) return;
    for (const tr of sandboxList.querySelectorAll("tr[data-sandbox]")) tr.classList.toggle("selected", tr.getAttribute("data-sandbox") === sb.id);
    procs = new Map();
    sandboxPanel.dataset.sandbox = sb.id;
    sandboxPanel.replaceChildren(
      h("h2", {}, "Sandbox ", h("span", { class: "id", title: sb.id }, short(sb.id))),
      h("p", {}, "State: ", h("span", { class: "sandbox-state" }, stateText(info)), " · ", limitsText(info), info.image ? ` · image ${info.image}` : "",
        info.node ? h("span", { class: "sandbox-node" }, ` · node ${info.node}`) : null),
      startForm(sb, (id) => openProcess(sb, id), () => listProcesses()),
      h("table", { id: "processes" },
        h("thead", {}, h("tr", {}, h("th", { class: "wide" }, "process"), h("th", {}, "command"), h("th", {}, "state"), h("th", {}, "exit"), h("th", {}, "output"), h("th", {}))),
        h("tbody")),
      filesPanel(sb));
    await listProcesses();
  };

  const openProcess = async (sb: Sandbox, id: string) => {
    go({ sandbox: sb.id, process: id });
    viewer?.close();
    // An observer: what it falls behind on is shown as a gap, with its count.
    const handle = await sb.processes.get(id, { format: "text", overflow: "report" });
    viewer = handle instanceof TerminalHandle ? terminalView(view, handle, () => listProcesses()) : logView(view, handle as ProcessHandle<Chunk>, () => listProcesses());
  };

  // What the URL's fragment names opens again.
  (async () => {
    const p = place();
    if (p.sandbox) {
      try {
        open = await client.sandboxes.get(p.sandbox);
      } catch (err) {
        report(err);
        go({});
      }
    }
    await listSandboxes();
    if (open) await showSandbox(open);
    if (open && p.process) await openProcess(open, p.process);
  })().catch(report);
}

/**
 * f, run once at a time: a call while it runs is answered by one more run
 * after it, however many calls came, so that what a run reads is never
 * older than the call.
 */
function coalesced(f: () => Promise<void>): () => Promise<void> {
  let running: Promise<void> | undefined;
  let again: Promise<void> | undefined;
  const run = (): Promise<void> => {
    if (!running) {
      running = f().finally(() => {
        running = undefined;
      });
      return running;
    }
    again ??= running.catch(() => {}).then(() => {
      again = undefined;
      return run();
    });
    return again;
  };
  return run;
}

function stateText(s: SandboxInfo): string {
  return s.state + (s.reason ? `: ${s.reason}` : "");
}

function processExit(p: Process): { exitCode: number | null; signal: string | null; oomKilled?: boolean } {
  return { exitCode: p.exit_code ?? null, signal: signalName(p.signal), oomKilled: p.oom_killed };
}

/** The exit code, and the signal that ended the process if one did: "0", "143 SIGTERM". */
function exitCell(p: Process): string {
  if (p.state !== "exited") return "";
  const code = p.exit_code ?? "?";
  const signal = signalName(p.signal);
  if (!signal) return String(code);
  return `${code} ${signal}${p.oom_killed ? " (out of memory)" : ""}`;
}

/** A byte count as people read it; the exact count is the element's title. */
function bytesText(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  for (; v >= 1024 && i < units.length - 1; i++) v /= 1024;
  return `${v.toFixed(1)} ${units[i]}`;
}

/** A process's streams, stdout first. */
function byStream(p: Process): [string, Process["streams"][string]][] {
  const order = ["stdout", "stderr", "terminal"];
  return Object.entries(p.streams ?? {}).sort(([a], [b]) => order.indexOf(a) - order.indexOf(b));
}

/** Per stream, the bytes written, and those its captured log lost when any were. */
function streamCells(p: Process): HTMLElement[] {
  return byStream(p).map(([name, st]) => {
    const dropped = st.capture_dropped ?? 0;
    return h("span", {
      class: "stream", "data-stream": name, "data-bytes": String(st.total_bytes), "data-dropped": String(dropped),
      title: `${name}: ${st.total_bytes} bytes${dropped ? `, ${dropped} of them not in its captured log` : ""}`,
    }, `${name} ${bytesText(st.total_bytes)}`, dropped ? h("span", { class: "dropped" }, `, ${bytesText(dropped)} not logged`) : null);
  });
}

/** The recent events, newest first, and whether they are followed. */
function eventsPanel(): { panel: HTMLElement; add(e: KilnEvent): void; status(state: string, text: string): void } {
  const list = h("ol", { id: "events-list", reversed: "" });
  const status = h("span", { id: "events-status" }, "connecting");
  const panel = h("section", { id: "events", "data-state": "connecting" }, h("h2", {}, "Events ", status), list);
  return {
    panel,
    add(e) {
      const time = new Date(e.time);
      list.prepend(h("li", { "data-seq": String(e.seq), "data-type": e.type, ...(e.sandbox ? { "data-sandbox": e.sandbox } : {}) },
        h("time", { datetime: e.time, title: e.time }, time.toLocaleTimeString()), " ",
        h("span", { class: "type" }, e.type), " ",
        eventText(e)));
      while (list.childElementCount > MAX_EVENTS_SHOWN) list.lastElementChild!.remove();
    },
    status(state, text) {
      panel.dataset.state = state;
      status.textContent = text;
    },
  };
}

function eventText(e: KilnEvent): string {
  const who = e.sandbox ? short(e.sandbox) + (e.name ? ` (${e.name})` : "") : "";
  const p = e.process;
  switch (e.type) {
    case "gap":
      return `${e.lost} events lost` + (who ? ` of ${who}` : "") + (e.reason ? `: ${e.reason}` : "");
    case "process.started":
      return `${who} ${p ? short(p.id) + " " + [p.command, ...(p.args ?? [])].join(" ") : ""}`;
    case "process.exited": {
      if (!p) return who;
      const streams = byStream(p).map(([s, st]) => `${s} ${bytesText(st.total_bytes)}`).join(", ");
      return `${who} ${short(p.id)} ${[p.command, ...(p.args ?? [])].join(" ")}: exit ${exitCell(p)}${streams ? ", " + streams : ""}`;
    }
    default:
      return who + (e.reason ? `: ${e.reason}` : "") + (e.exit ? ` (${exitText({ exitCode: e.exit.exit_code ?? null, signal: signalName(e.exit.signal) })})` : "");
  }
}

async function withHandle(sb: Sandbox, id: string, f: (h: ProcessHandle<Chunk> | TerminalHandle) => Promise<unknown>): Promise<void> {
  const hd = await sb.processes.get(id);
  try {
    await f(hd);
  } finally {
    await hd.detach();
  }
}

function limitsText(s: SandboxInfo): string {
  const l = s.limits ?? {};
  const parts: string[] = [];
  if (l.memory_bytes) parts.push(`${Math.round(l.memory_bytes / (1 << 20))} MiB`);
  if (l.cpus) parts.push(`${l.cpus} CPU`);
  if (l.pids) parts.push(`${l.pids} pids`);
  if (l.disk_bytes) parts.push(`${Math.round(l.disk_bytes / (1 << 30))} GiB disk`);
  return parts.join(", ") || "no limits";
}

function createForm(client: Client, done: () => Promise<void>): HTMLFormElement {
  const memory = h("input", { type: "number", name: "memory", min: "0", placeholder: "memory MiB (default)" });
  const cpus = h("input", { type: "number", name: "cpus", min: "0", step: "0.1", placeholder: "CPUs (default)" });
  const pids = h("input", { type: "number", name: "pids", min: "0", placeholder: "pids (default)" });
  const image = h("input", { type: "text", name: "image", placeholder: "image (optional)" });
  const form = h("form", { id: "create" }, memory, cpus, pids, image, h("button", { type: "submit" }, "Create sandbox"));
  form.onsubmit = async (ev) => {
    ev.preventDefault();
    const limits: Record<string, number> = {};
    if (memory.value) limits.memory_bytes = Math.round(Number(memory.value) * (1 << 20));
    if (cpus.value) limits.cpus = Number(cpus.value);
    if (pids.value) limits.pids = Number(pids.value);
    const submit = form.querySelector("button")!;
    submit.disabled = true;
    try {
      await client.sandboxes.create({ limits, ...(image.value ? { image: image.value } : {}) });
      await done();
    } catch (err) {
      report(err);
    } finally {
      submit.disabled = false;
    }
  };
  return form;
}

function startForm(sb: Sandbox, opened: (id: string) => Promise<void>, done: () => Promise<void>): HTMLFormElement {
  const script = h("input", { type: "text", name: "command", placeholder: "a command line (sh -c)", size: "50" });
  const terminal = h("input", { type: "checkbox", name: "terminal", id: "start-terminal" });
  const capture = h("input", { type: "checkbox", name: "capture", id: "start-capture" });
  const form = h("form", { id: "start" }, script,
    h("label", {}, terminal, " terminal"), h("label", {}, capture, " capture"),
    h("button", { type: "submit" }, "Start"));
  form.onsubmit = async (ev) => {
    ev.preventDefault();
    const given = script.value.trim() ? { kind: "shell" as const, script: script.value } : undefined;
    try {
      if (terminal.checked) {
        const command = given ?? { kind: "argv" as const, argv: await loginShell(sb) };
        const t = await sb.terminals.start({ command, capture: capture.checked });
        const id = t.id;
        await t.detach();
        await opened(id);
      } else {
        const command = given ?? { kind: "argv" as const, argv: ["sh"] };
        const p = await sb.processes.start({ command, capture: capture.checked, output: { mode: "stream" } });
        const id = p.id;
        await p.detach();
        await opened(id);
      }
      await done();
    } catch (err) {
      report(err);
    }
  };
  return form;
}

/**
 * What a terminal given no command runs: the sandbox's bash where it has
 * one, else sh, each as a login shell (as kiln shell runs sh). The files
 * API says whether /bin/bash is there: asking costs no process, which a
 * shell script choosing for itself would, and the process list then
 * names the shell that runs. An image without bash (busybox's, Alpine's)
 * answers NOT_FOUND.
 */
async function loginShell(sb: Sandbox): Promise<string[]> {
  try {
    await sb.files.stat("/bin/bash");
    return ["/bin/bash", "-l"];
  } catch (err) {
    if (err instanceof SandkilnError && err.code === "NOT_FOUND") return ["sh", "-l"];
    throw err;
  }
}

/**
 * Reads a handle's output to its end, resuming by offsets across breaks;
 * a terminal's bytes lost (its output has no gap chunks) are told to lost,
 * and reading goes on after them.
 */
async function follow<C>(handle: { output(o: { signal: AbortSignal }): AsyncIterable<C>; wait(o: { signal: AbortSignal }): Promise<WaitResult>; readonly lostBytes: number },
  signal: AbortSignal, status: HTMLElement, take: (c: C) => void, lost?: (n: number) => void): Promise<WaitResult | undefined> {
  let wait = 250;
  for (;;) {
    const before = handle.lostBytes;
    try {
      status.textContent = "following";
      for await (const c of handle.output({ signal })) {
        take(c);
        wait = 250;
      }
      break;
    } catch (err) {
      if (signal.aborted) return undefined;
      if (lost && err instanceof SandkilnError && err.code === "OUTPUT_CAPACITY") {
        lost(handle.lostBytes - before);
        continue;
      }
      if (!(err instanceof SandkilnError) || err.code !== "UNAVAILABLE") throw err;
      // The connection broke: resume from where the output stands.
      status.textContent = `reconnecting in ${wait} ms: ${err.message}`;
      await new Promise((r) => setTimeout(r, wait));
      wait = Math.min(2 * wait, 5000);
    }
  }
  status.textContent = "waiting for the exit";
  const r = await handle.wait({ signal });
  status.textContent = "ended";
  return r;
}

function summary(r: WaitResult): string {
  return Object.entries(r.streams)
    .map(([s, c]) => `${s}: ${c.bytes} bytes${c.lostBytes ? `, ${c.lostBytes} lost` : ""}`)
    .join(" · ") + (r.outputComplete ? " · complete" : " · incomplete");
}

function logView(view: HTMLElement, handle: ProcessHandle<Chunk>, done: () => Promise<void>): { close(): void } {
  const ac = new AbortController();
  const log = h("pre", { id: "log", "aria-live": "polite" });
  const status = h("p", { id: "log-status" }, "connecting");
  const foot = h("p", { id: "log-summary" });
  view.replaceChildren(h("h2", {}, "Logs of ", h("span", { class: "id", title: handle.id }, short(handle.id))), status, log, foot);
  let kept = 0;
  let last: HTMLSpanElement | undefined;
  const add = (el: HTMLElement, size: number) => {
    log.append(el);
    kept += size;
    while (kept > MAX_LOG_CHARS && log.firstChild) {
      const first = log.firstChild as HTMLElement;
      kept -= first.textContent?.length ?? 0;
      first.remove();
      if (!log.querySelector(".trimmed")) log.prepend(h("span", { class: "trimmed" }, "[older output not shown]\n"));
    }
    if (log.scrollHeight - log.scrollTop - log.clientHeight < 80) log.scrollTop = log.scrollHeight;
  };
  (async () => {
    const r = await follow<Chunk>(handle, ac.signal, status, (c) => {
      if (c.lost) {
        last = undefined;
        const gap = h("span", { class: "gap", "data-lost": String(c.lost), "data-stream": c.stream }, `[${c.lost} bytes of ${c.stream} lost]\n`);
        add(gap, gap.textContent!.length);
        return;
      }
      const text = "text" in c ? c.text : new TextDecoder().decode(c.bytes);
      if (last && last.dataset.stream === c.stream && (last.textContent?.length ?? 0) < 64 << 10) {
        last.append(text);
        kept += text.length;
        if (log.scrollHeight - log.scrollTop - log.clientHeight < 80) log.scrollTop = log.scrollHeight;
        return;
      }
      last = h("span", { class: c.stream, "data-stream": c.stream }, text);
      add(last, text.length);
    });
    if (!r) return;
    add(h("span", { class: "exit" }, `[${exitText(r)}]\n`), 0);
    foot.textContent = summary(r);
    await done();
  })().catch((err) => {
    if (!ac.signal.aborted) {
      status.textContent = "stopped";
      report(err);
    }
  });
  return {
    close() {
      ac.abort();
      handle.detach();
    },
  };
}

function terminalView(view: HTMLElement, handle: TerminalHandle, done: () => Promise<void>): { close(): void } {
  const ac = new AbortController();
  const box = h("div", { id: "terminal" });
  const status = h("p", { id: "log-status" }, "connecting");
  const foot = h("p", { id: "log-summary" });
  view.replaceChildren(h("h2", {}, "Terminal ", h("span", { class: "id", title: handle.id }, short(handle.id))), status, box, foot);
  const term = new Terminal({ cursorBlink: true, fontSize: 13, fontFamily: "ui-monospace, monospace", scrollback: 5000 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  // A terminal whose process has exited has no size to set (kilnd would
  // refuse it): the window may still change.
  let ended = false;
  const resize = () => {
    if (!ended) handle.resize({ columns: term.cols, rows: term.rows }).catch(() => {});
  };
  resize();
  term.onResize(resize);
  const onWindow = () => fit.fit();
  window.addEventListener("resize", onWindow);
  // Input in order: each write waits for the one before.
  let typing: Promise<unknown> = Promise.resolve();
  term.onData((d) => {
    typing = typing.then(() => handle.write(d)).catch(report);
  });
  term.focus();
  (async () => {
    const r = await follow<Uint8Array>(handle, ac.signal, status, (b) => term.write(b), (n) => term.write(`\r\n[${n} bytes lost]\r\n`));
    ended = true;
    if (!r) return;
    term.write(`\r\n[${exitText(r)}]\r\n`);
    foot.textContent = summary(r);
    await done();
  })().catch((err) => {
    if (!ac.signal.aborted) report(err);
  });
  return {
    close() {
      ac.abort();
      window.removeEventListener("resize", onWindow);
      handle.detach();
      term.dispose();
    },
  };
}

function filesPanel(sb: Sandbox): HTMLElement {
  const at = h("input", { type: "text", name: "path", value: "/workspace", size: "40" });
  const list = h("tbody");
  const upload = h("input", { type: "file", name: "upload" });
  const show = async () => {
    const dir = at.value.replace(/\/+$/, "") || "/";
    const entries: FileInfo[] = await sb.files.list(dir);
    const join = (n: string) => (dir === "/" ? "/" + n : dir + "/" + n);
    list.replaceChildren(
      ...(dir !== "/" ? [h("tr", {}, h("td", {}, button("..", () => { at.value = dir.replace(/\/[^/]*$/, "") || "/"; return show(); })), h("td", {}), h("td", {}))] : []),
      ...entries.map((e) => h("tr", { "data-file": e.name },
        h("td", {}, e.type === "dir" ? button(e.name + "/", () => { at.value = join(e.name); return show(); }) : e.name),
        h("td", {}, e.type === "dir" ? "" : String(e.size)),
        h("td", {}, e.type === "file" && button("Download", async () => {
          const bytes = await sb.files.read(join(e.name));
          const url = URL.createObjectURL(new Blob([bytes as BlobPart]));
          const a = h("a", { href: url, download: e.name });
          a.click();
          setTimeout(() => URL.revokeObjectURL(url), 10_000);
        })))));
  };
  upload.onchange = async () => {
    const f = upload.files?.[0];
    if (!f) return;
    try {
      const dir = at.value.replace(/\/+$/, "");
      await sb.files.write(`${dir}/${f.name}`, new Uint8Array(await f.arrayBuffer()));
      upload.value = "";
      await show();
    } catch (err) {
      report(err);
    }
  };
  const panel = h("div", { id: "files" }, h("h3", {}, "Files"), h("div", {}, at, button("List", show), " upload: ", upload), h("table", {}, list));
  return panel;
}

// ---- start ----

const token = sessionStorage.getItem(TOKEN_KEY);
if (token) main(new Client({ url: location.origin, token }), token);
else login();
