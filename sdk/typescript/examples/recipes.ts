// The streaming seed's three recipes, against kilnd. Each takes a client
// and returns what it saw, so that a test can hold it to what it should.

import { Client, readProcessLines, createProcessTail, type Sandbox } from "@sandkiln/sdk";

/** buildWithProgress: read a build's output as it arrives, then wait for its exit. */
export async function buildWithProgress(sandbox: Sandbox, onLine: (line: string) => void = console.log) {
  const child = await sandbox.processes.start({
    command: { kind: "argv", argv: ["sh", "-c", "for step in fetch compile link; do echo \"[build] $step\"; sleep 0.2; done; echo 'warning: 1 unused' >&2"] },
    output: { mode: "stream" },
  });
  // The last lines, kept for a failure report: each chunk goes to the tail
  // as it goes on to the lines.
  const tail = createProcessTail({ maxLines: 20 });
  const chunks = (async function* () {
    for await (const chunk of child.output()) {
      tail.push(chunk);
      yield chunk;
    }
  })();
  try {
    for await (const line of readProcessLines(chunks)) {
      onLine(`${line.stream}: ${line.text}`);
    }
    const result = await child.wait();
    return { result, tail: tail.snapshot() };
  } finally {
    await child.detach();
  }
}

/** interactiveWorker: send requests while reading the answers, then close stdin. */
export async function interactiveWorker(sandbox: Sandbox, requests: string[]) {
  const child = await sandbox.processes.start({
    command: { kind: "argv", argv: ["python3", "-u", "-c", "import sys\nfor line in sys.stdin: print('done:', line.strip().upper())"] },
    stdin: "pipe",
    output: { mode: "stream" },
  });
  const answers: string[] = [];
  const output = (async () => {
    for await (const line of readProcessLines(child.output())) {
      if (line.stream === "stdout") answers.push(line.text);
    }
  })();
  const completion = Promise.allSettled([output, child.wait()]);
  try {
    for (const r of requests) await child.write(r + "\n");
    await child.closeStdin();
    const status = await child.status();
    const [out, exit] = await completion;
    return { answers, status, out, exit };
  } finally {
    await child.detach();
  }
}

/**
 * serverWorkspace: start a server, read its logs, get a preview URL (for a
 * browser: its host, ID.localhost, is one browsers resolve themselves),
 * check readiness through kilnd for up to 15 s; then terminate it and wait
 * for its exit within a 10 s cleanup budget; finally detach, destroy the
 * sandbox and close the client.
 */
export async function serverWorkspace(client: Client) {
  const sandbox = await client.sandboxes.create();
  const logs: string[] = [];
  const server = await sandbox.processes.start({
    command: { kind: "argv", argv: ["python3", "-u", "-m", "http.server", "8080", "--bind", "127.0.0.1", "--directory", "/workspace"] },
    output: { mode: "stream" },
  });
  const reading = (async () => {
    for await (const line of readProcessLines(server.output())) logs.push(line.text);
  })().catch(() => {}); // ends when the handle is detached
  try {
    await sandbox.files.write("/workspace/index.html", "<h1>hello from the sandbox</h1>\n");
    const preview = await sandbox.previews.create({ port: 8080, ttlSeconds: 300 });
    // Starting the server did not publish its port; the preview does, for
    // a browser. This program reaches the port through kilnd.
    const ready = AbortSignal.timeout(15_000);
    let page = "";
    while (!page) {
      ready.throwIfAborted();
      const resp = await sandbox.ports.fetch(8080, "/", { signal: ready }).catch(() => undefined);
      if (resp?.status === 200) page = await resp.text();
      else await new Promise((r) => setTimeout(r, 100));
    }
    // Application work would go here.
    const cleanup = AbortSignal.timeout(10_000);
    const terminated = await server.terminate({ signal: cleanup });
    const exit = await server.wait({ signal: cleanup });
    // Its last lines may still be on their way: read to the output's end,
    // within the same budget, before the handle is let go.
    await Promise.race([reading, new Promise((r) => cleanup.addEventListener("abort", r, { once: true }))]);
    return { page, previewURL: preview.url!, terminated, exit, logs };
  } finally {
    await server.detach();
    await reading;
    await sandbox.destroy();
    await client.close();
  }
}
