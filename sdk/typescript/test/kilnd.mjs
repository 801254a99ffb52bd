// A real kilnd for the tests: built from this repository (or $KILND),
// on a state directory of its own and a loopback port it chooses, taking
// any port of 127.0.0.1 as its Host (the tests reach it through proxies).

import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, rmdirSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

function binary() {
  if (process.env.KILND) return process.env.KILND;
  const out = join(tmpdir(), "sandkiln-sdk-test-kilnd");
  // Static, as the README runs it; go build is a no-op when nothing changed.
  execFileSync("go", ["build", "-o", out, "./cmd/kilnd"], { cwd: repo, env: { ...process.env, CGO_ENABLED: "0" }, stdio: "inherit" });
  return out;
}

/** Runs kilnd on state, listening on listen; resolves once it serves, with its URL. */
async function run(state, listen, flags) {
  const child = spawn(binary(), ["--state-dir", state, "--listen", listen, "--allow-host", "127.0.0.1", ...flags], { stdio: ["ignore", "ignore", "pipe"] });
  // A test run that ends early (a timeout, a failed hook, a runner that
  // exits without its after hooks: Deno's, now and then) takes its kilnd with it, and the
  // sandboxes stop() would have deleted (they outlive a kilnd, as they
  // should): their agents, each its sandbox's first process, are killed.
  const kill = () => {
    child.kill("SIGKILL");
    killAgents(state);
    try {
      rmSync(state, { recursive: true, force: true });
    } catch {
      // what is left is in the system's temporary directory
    }
  };
  process.on("exit", kill);
  // Deno's test runner, when it skips or filters out tests, may end
  // without the exit event (and without the file's after hooks); its
  // unload event comes all the same.
  globalThis.Deno && globalThis.addEventListener?.("unload", kill);
  const k = { child, log: "", kill };
  k.url = await new Promise((resolve, reject) => {
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (s) => {
      k.log += s;
      const m = /msg="kilnd serving".* listen=(\S+)/.exec(k.log);
      if (m) resolve("http://" + m[1]);
    });
    child.on("exit", (code) => reject(new Error(`kilnd exited (${code}):\n${k.log}`)));
  });
  return k;
}

/**
 * Kills every sandbox kilnd recorded on state: everything in its cgroup, then its agent if
 * it is still the process recorded (a hybrid host's v2 group may not hold it), then removes
 * its cgroups, as kilnd's delete would have.
 */
function killAgents(state) {
  let ids = [];
  try {
    ids = readdirSync(join(state, "sandboxes"));
  } catch {
    return;
  }
  for (const id of ids) {
    try {
      const rec = JSON.parse(readFileSync(join(state, "sandboxes", id, "sandbox.json"), "utf8"));
      const { pid, started, cgroups } = rec.sandbox ?? {};
      if (!pid || rec.state === "deleted") continue;
      if (cgroups?.v2) killCgroup(cgroups.v2);
      try {
        // Field 22 of /proc/PID/stat, its start time: not a process that reused the pid.
        const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
        if (Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]) === started) process.kill(pid, "SIGKILL");
      } catch {
        // gone already
      }
      if (cgroups) removeCgroups(cgroups);
    } catch {
      // never recorded
    }
  }
}

/** Kills everything in the v2 group dir and waits, up to 2 s, until it is empty. */
function killCgroup(dir) {
  try {
    writeFileSync(join(dir, "cgroup.kill"), "1");
  } catch {
    return; // no such group, or no cgroup.kill
  }
  // An exit handler cannot wait on events: it polls.
  for (const deadline = Date.now() + 2000; Date.now() < deadline; ) {
    try {
      if (/^populated 0$/m.test(readFileSync(join(dir, "cgroup.events"), "utf8"))) return;
    } catch {
      return;
    }
  }
}

/** Removes a sandbox's cgroups, its leaves first, in the order kilnd's delete does. */
function removeCgroups(cg) {
  const dirs = [cg.procs, cg.memory_procs, cg.leaves && join(cg.v2, "procs"), ...Object.values(cg.v1 ?? {}), cg.leaves && join(cg.v2, "agent"), cg.v2];
  for (const dir of dirs) {
    if (!dir) continue;
    try {
      rmdirSync(dir);
    } catch {
      // gone already, or still busy: what is left is empty or dying
    }
  }
}

async function end(k) {
  const exited = new Promise((r) => k.child.on("exit", r));
  k.child.kill("SIGTERM");
  await exited;
  process.off("exit", k.kill);
  globalThis.Deno && globalThis.removeEventListener?.("unload", k.kill);
}

/** Starts kilnd; resolves with { url, token, state, log, restart, stop }. */
export async function startKilnd(...flags) {
  if (process.getuid?.() !== 0) throw new Error("kilnd needs root");
  const state = mkdtempSync(join(tmpdir(), "sandkiln-sdk-"));
  let k = await run(state, "127.0.0.1:0", flags);
  const url = k.url;
  const token = readFileSync(join(state, "token"), "utf8").trim();
  let logs = "";
  return {
    url,
    token,
    state,
    log: () => logs + k.log,
    /** Stops kilnd and starts it again on the same state and address: its sandboxes go on, and it adopts them. */
    async restart() {
      await end(k);
      logs += k.log;
      k = await run(state, new URL(url).host, flags);
    },
    async stop() {
      // kilnd leaves its sandboxes running when it stops, as it should:
      // delete them first.
      const auth = { Authorization: "Bearer " + token };
      const list = await (await fetch(url + "/sandboxes", { headers: auth })).json();
      for (const s of list ?? []) {
        await fetch(url + "/sandboxes/" + s.id + "?remove_logs=true", { method: "DELETE", headers: auth });
      }
      await end(k);
      if (existsSync(state)) rmSync(state, { recursive: true, force: true });
    },
  };
}
