// Validates an AsyncAPI document with @asyncapi/parser, the reference
// parser, and prints what it found as one JSON object: its diagnostics
// (severity 0 is an error, 1 a warning, 2 information, 3 a hint) and, when
// it could read the document, the channels' addresses and the operations'
// actions as it read them, for the caller to hold against its own reading.
// It exits 1 when any diagnostic is an error, or no document came out.
//
//   node validate.mjs ../../api/asyncapi.yaml

import { readFile } from "node:fs/promises";
import { Parser } from "@asyncapi/parser";

const file = process.argv[2];
if (!file) {
  console.error("usage: node validate.mjs DOCUMENT");
  process.exit(2);
}
const { document, diagnostics } = await new Parser().parse(await readFile(file, "utf8"), { source: file });
const report = {
  diagnostics: diagnostics.map((d) => ({ code: String(d.code), severity: d.severity, message: d.message, path: d.path.join(".") })),
  channels: {},
  operations: {},
};
if (document) {
  for (const c of document.channels()) report.channels[c.id()] = c.address();
  for (const o of document.operations()) report.operations[o.id()] = o.action();
}
console.log(JSON.stringify(report, null, 2));
process.exit(!document || diagnostics.some((d) => d.severity === 0) ? 1 : 0);
