// The hooks of a test file that works in one sandbox of a kilnd of its own.

import { before, after } from "node:test";

import { Client } from "../dist/index.js";
import { startKilnd } from "./kilnd.mjs";

/**
 * Registers the file's hooks: before, a kilnd, a client of it and a
 * sandbox, given to set as { kilnd, client, sandbox }; after, the sandbox
 * deleted (its logs too when removeLogs), the client closed, and kilnd
 * stopped, which deletes every sandbox left whatever failed before it.
 */
export function sandboxSuite(set, { removeLogs = false } = {}) {
  let kilnd, client, sandbox;
  before(async () => {
    kilnd = await startKilnd();
    client = new Client({ url: kilnd.url, token: kilnd.token });
    sandbox = await client.sandboxes.create();
    set({ kilnd, client, sandbox });
  });
  after(async () => {
    try {
      await sandbox?.destroy({ removeLogs });
      await client?.close();
    } finally {
      await kilnd?.stop();
    }
  });
}
