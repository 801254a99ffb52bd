// src/wire.ts is generated from the OpenAPI document: it must be current.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));

test("src/wire.ts is what openapi-typescript makes of api/openapi.yaml", () => {
  const made = execFileSync(process.execPath.includes("bun") ? "node" : process.execPath,
    [here("../node_modules/openapi-typescript/bin/cli.js"), here("../../../api/openapi.yaml")], { encoding: "utf8" });
  const kept = readFileSync(here("../src/wire.ts"), "utf8");
  assert.ok(made === kept, "src/wire.ts is stale: run npm run gen");
});
