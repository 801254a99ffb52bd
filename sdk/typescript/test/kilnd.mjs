// A real kilnd for the tests: built from this repository (or $KILND),
// on a state directory of its own and a loopback port it chooses, taking
// any port of 127.0.0.1 as its Host (the tests reach it through proxies).

import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, existsSync } from "node:fs";
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

/** Starts kilnd; resolves with { url, token, stop }. */
export async function startKilnd(...flags) {
  if (process.getuid?.() !== 0) throw new Error("kilnd needs root");
  const state = mkdtempSync(join(tmpdir(), "sandkiln-sdk-"));
  const child = spawn(binary(), ["--state-dir", state, "--listen", "127.0.0.1:0", "--allow-host", "127.0.0.1", ...flags], { stdio: ["ignore", "ignore", "pipe"] });
  // A test run that ends early (a timeout, a failed hook) takes its
  // kilnd with it; its sandboxes are deleted by stop() alone, which the
  // tests' after hooks call.
  const kill = () => child.kill("SIGKILL");
  process.on("exit", kill);
  let log = "";
  const url = await new Promise((resolve, reject) => {
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (s) => {
      log += s;
      const m = /msg="kilnd serving".* listen=(\S+)/.exec(log);
      if (m) resolve("http://" + m[1]);
    });
    child.on("exit", (code) => reject(new Error(`kilnd exited (${code}):\n${log}`)));
  });
  const token = readFileSync(join(state, "token"), "utf8").trim();
  return {
    url,
    token,
    state,
    log: () => log,
    async stop() {
      // kilnd leaves its sandboxes running when it stops, as it should:
      // delete them first.
      const auth = { Authorization: "Bearer " + token };
      const list = await (await fetch(url + "/sandboxes", { headers: auth })).json();
      for (const s of list ?? []) {
        await fetch(url + "/sandboxes/" + s.id + "?remove_logs=true", { method: "DELETE", headers: auth });
      }
      const exited = new Promise((r) => child.on("exit", r));
      child.kill("SIGTERM");
      await exited;
      process.off("exit", kill);
      if (existsSync(state)) rmSync(state, { recursive: true, force: true });
    },
  };
}
