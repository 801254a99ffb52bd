// npm pack, installed into an empty project, runs the README's example,
// and the repository README's quick start, against a real kilnd: the
// package as a user gets it.

import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";

import { startKilnd } from "./kilnd.mjs";

const pkg = fileURLToPath(new URL("..", import.meta.url));
const readme = readFileSync(join(pkg, "README.md"), "utf8");
const example = /```js\n([\s\S]*?)```/.exec(readme)?.[1];
assert.ok(example, "README.md has no js example");
const quick = /```js\n([\s\S]*?)```/.exec(readFileSync(join(pkg, "../../README.md"), "utf8"))?.[1];
assert.ok(quick, "the repository's README has no js quick start");
assert.equal(quick.trim().split("\n").length, 5, "the quick start is five lines");

const work = mkdtempSync(join(tmpdir(), "sandkiln-pack-"));
const kilnd = await startKilnd();
try {
  const tgz = execFileSync("npm", ["pack", "--silent", "--pack-destination", work], { cwd: pkg, encoding: "utf8" }).trim().split("\n").pop();
  const project = join(work, "app");
  execFileSync("mkdir", ["-p", project]);
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  const deps = [join(work, tgz)];
  if (Number(process.versions.node.split(".")[0]) < 22) deps.push("ws@8");
  execFileSync("npm", ["install", "--no-audit", "--no-fund", "--silent", ...deps], { cwd: project, stdio: "inherit" });
  const run = (name, code) => {
    writeFileSync(join(project, name), code);
    return execFileSync(process.execPath, [name], {
      cwd: project, encoding: "utf8", env: { ...process.env, KILN_ADDR: kilnd.url, KILN_TOKEN: kilnd.token },
    });
  };
  const out = run("example.mjs", example);
  assert.match(out, /^line-1\nline-2\nline-3\n/);
  assert.match(out, /exitCode: 0/);
  assert.match(out, /outputComplete: true/);
  assert.equal(run("quick.mjs", quick), "line-1\nline-2\nline-3\n\n");
  // Both destroyed their sandboxes.
  const left = await (await fetch(kilnd.url + "/sandboxes", { headers: { Authorization: "Bearer " + kilnd.token } })).json();
  assert.deepEqual(left ?? [], []);
  // The package holds what it says and nothing more.
  const files = execFileSync("tar", ["-tzf", join(work, tgz)], { encoding: "utf8" }).split("\n").filter(Boolean);
  assert.ok(files.includes("package/dist/index.js") && files.includes("package/dist/index.d.ts"), files.join("\n"));
  assert.ok(!files.some((f) => f.includes("/test/") || f.includes("/src/") || f.includes("node_modules")), files.join("\n"));
  console.log(`pack: ${tgz} (${files.length} files) installs and runs the README's example and the quick start`);
} finally {
  await kilnd.stop();
  rmSync(work, { recursive: true, force: true });
}
