// kiln mcp (spawned as the README's mcpServers block says, on stdio) and kilnd's /mcp (over HTTP, with the
// token) driven by the official TypeScript MCP client, against a real
// kilnd: the tools a model sees, a build's output paged by offsets, and
// a bad argument answered as a tool error the model can read; and the
// captured log as a resource.

import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { startKilnd } from "../../../sdk/typescript/test/kilnd.mjs";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

/** Builds kiln (or takes $KILN), as a user's MCP client would start it. */
function kilnBinary() {
  if (process.env.KILN) return process.env.KILN;
  const out = join(tmpdir(), "sandkiln-mcp-test-kiln");
  execFileSync("go", ["build", "-o", out, "./cmd/kiln"], { cwd: repo, env: { ...process.env, CGO_ENABLED: "0" }, stdio: "inherit" });
  return out;
}

const TOOLS = [
  "exec", "file_list", "file_read", "file_write", "preview_url", "process_output", "process_signal",
  "process_start", "process_write_stdin", "sandbox_create", "sandbox_delete", "sandbox_list", "sandbox_start", "sandbox_stop",
];

let kilnd;
let kiln;
before(async () => {
  kiln = kilnBinary();
  kilnd = await startKilnd();
});
after(async () => {
  await kilnd?.stop();
});

/** The README's mcpServers block, which an MCP client reads to start kiln mcp. */
function readmeServer() {
  const readme = readFileSync(join(repo, "README.md"), "utf8");
  const block = /```json\n(\{\n  "mcpServers"[\s\S]*?)```/.exec(readme);
  assert.ok(block, "the README has no mcpServers block");
  assert.equal(block[1].trim().split("\n").length, 5, "the README's mcpServers block is five lines");
  return JSON.parse(block[1]).mcpServers.sandkiln;
}

const transports = {
  // As the README tells a client to start it, kiln being the one built
  // here and kilnd the test's.
  stdio: () => {
    const server = readmeServer();
    assert.equal(server.command, "kiln");
    return new StdioClientTransport({
      command: kiln,
      args: server.args,
      env: { ...getDefaultEnvironment(), KILN_STATE_DIR: kilnd.state },
      stderr: "inherit",
    });
  },
  http: () =>
    new StreamableHTTPClientTransport(new URL(kilnd.url + "/mcp"), {
      requestInit: { headers: { Authorization: `Bearer ${kilnd.token}` } },
    }),
};

/** Calls a tool that must succeed; resolves with its structured result. */
async function call(client, name, args) {
  const res = await client.callTool({ name, arguments: args });
  assert.ok(!res.isError, `${name}: ${JSON.stringify(res.content)}`);
  return res.structuredContent;
}

for (const [name, transport] of Object.entries(transports)) {
  describe(`over ${name}`, () => {
    let client;
    let sandbox;
    before(async () => {
      client = new Client({ name: "sandkiln-interop", version: "1.0.0" });
      await client.connect(transport());
      sandbox = (await call(client, "sandbox_create", {})).id;
    });
    after(async () => {
      if (sandbox) await call(client, "sandbox_delete", { sandbox, remove_logs: true });
      await client?.close();
    });

    test("lists the tools, each described for a model, with a JSON schema", async () => {
      const { tools } = await client.listTools();
      assert.deepEqual(tools.map((t) => t.name).sort(), TOOLS);
      for (const t of tools) {
        assert.ok(t.description.length >= 100, `${t.name}: ${t.description}`);
        assert.equal(t.inputSchema.type, "object", t.name);
        assert.ok(t.outputSchema, `${t.name} has no output schema`);
      }
    });

    test("a build's 10,000 lines, paged with process_output, come exactly once each", async () => {
      const build =
        'i=1; while [ $i -le 10000 ]; do echo "[$i/10000] compiling module_$i.o"; i=$((i+1)); done; echo "build done" >&2';
      const started = await call(client, "process_start", { sandbox, command: build });
      let offsets = started.offsets;
      let stdout = "";
      let stderr = "";
      let pages = 0;
      for (;;) {
        const r = await call(client, "process_output", { sandbox, pid: started.pid, offsets, wait_ms: 10000 });
        pages++;
        assert.ok(r.bytes <= r.max_bytes, `page ${pages}: ${r.bytes} bytes over its bound ${r.max_bytes}`);
        assert.match(r.note, new RegExp(`at most ${r.max_bytes} per call`));
        assert.equal(r.lost_bytes, undefined, "nothing may be lost");
        stdout += r.stdout;
        stderr += r.stderr;
        offsets = r.next_offsets;
        if (r.exited) {
          assert.equal(r.exit_code, 0);
          assert.equal(r.more, false);
          break;
        }
      }
      const lines = stdout.split("\n");
      assert.equal(lines.pop(), "", "the output ends with its last line's newline");
      assert.equal(lines.length, 10000);
      lines.forEach((line, i) => assert.equal(line, `[${i + 1}/10000] compiling module_${i + 1}.o`));
      assert.equal(stderr, "build done\n");
      assert.ok(pages >= 7, `${pages} pages for ${stdout.length} bytes at 16 KiB at most each`);
      assert.deepEqual(offsets, { stdout: stdout.length, stderr: stderr.length });

      // Its captured log is a resource: listed, and read (its last 64 KiB, saying so).
      const { resources } = await client.listResources();
      assert.ok(resources.some((r) => r.uri === started.log), `${started.log} is not listed`);
      const { contents } = await client.readResource({ uri: started.log });
      assert.match(contents[0].text, /^\[the log's first \d+ bytes are not shown: a resource holds its last 65536;/);
      const tail = contents[0].text;
      assert.ok(tail.includes("\n[10000/10000] compiling module_10000.o\n"), JSON.stringify(tail.slice(-300)));

      // The streams' records are interleaved as the capture took them. (In
      // the build's log, stderr's line may be more than 64 KiB from its end:
      // read from two pipes, it can come before stdout's last pipeful.)
      const small = await call(client, "process_start", { sandbox, command: "echo out; echo err >&2" });
      let at = small.offsets;
      for (;;) {
        const r = await call(client, "process_output", { sandbox, pid: small.pid, offsets: at, wait_ms: 10000 });
        at = r.next_offsets;
        if (r.exited) break;
      }
      const { contents: both } = await client.readResource({ uri: small.log });
      assert.deepEqual(both[0].text.split("\n").sort(), ["", "err", "out"], JSON.stringify(both[0].text));
    });

    test("a bad argument is a tool error the model can read, not a protocol failure", async () => {
      const cases = [
        [{ sandbox, command: "true", timeout_ms: "soon" }, /timeout_ms/],
        [{ sandbox, command: "true", max_output_bytes: 10 }, /max_output_bytes 10: want 256 to 65536/],
        [{ sandbox: "no-such-sandbox", command: "true" }, /no sandbox "no-such-sandbox"/],
        [{ sandbox }, /command or argv is required/],
      ];
      for (const [args, want] of cases) {
        const res = await client.callTool({ name: "exec", arguments: args });
        assert.equal(res.isError, true, JSON.stringify(args));
        assert.match(res.content[0].text, want);
      }
      const res = await client.callTool({ name: "process_output", arguments: { sandbox, pid: "nope", offsets: { stdout: -1 } } });
      assert.equal(res.isError, true);
      assert.match(res.content[0].text, /nope/);
    });

    test("exec states its bound and what it cut", async () => {
      const r = await call(client, "exec", { sandbox, command: "seq 1 100000", max_output_bytes: 1024 });
      assert.equal(r.exit_code, 0);
      assert.equal(r.truncated, true);
      assert.ok(r.stdout.length <= 1024);
      assert.match(r.note, /at most 1024 bytes/);
    });
  });
}
