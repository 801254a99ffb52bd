// npm pack, installed into an empty project, runs the README's example
// against a real kilnd: the package as a user gets it.

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
  writeFileSync(join(project, "example.mjs"), example);
  const out = execFileSync(process.execPath, ["example.mjs"], {
    cwd: project, encoding: "utf8", env: { ...process.env, KILN_ADDR: kilnd.url, KILN_TOKEN: kilnd.token },
  });
  assert.match(out, /^line-1\nline-2\nline-3\n/);
  assert.match(out, /exitCode: 0/);
  assert.match(out, /outputComplete: true/);
  // The package holds what it says and nothing more.
  const files = execFileSync("tar", ["-tzf", join(work, tgz)], { encoding: "utf8" }).split("\n").filter(Boolean);
  assert.ok(files.includes("package/dist/index.js") && files.includes("package/dist/index.d.ts"), files.join("\n"));
  assert.ok(!files.some((f) => f.includes("/test/") || f.includes("/src/") || f.includes("node_modules")), files.join("\n"));
  console.log(`pack: ${tgz} (${files.length} files) installs and runs the README's example`);
} finally {
  await kilnd.stop();
  rmSync(work, { recursive: true, force: true });
}
