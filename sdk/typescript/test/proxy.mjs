// A TCP proxy between the SDK and kilnd that reads each request's first
// line: it counts the requests, and for one that matches a rule it can
// hold the answer back until released, or cut the connection so that the
// request reaches kilnd and its answer never reaches the SDK (a lost
// acknowledgement, for real: kilnd did what was asked).

import net from "node:net";

const REQUEST = /^(GET|HEAD|POST|PUT|DELETE|PATCH|OPTIONS) (\S+) HTTP\/1\.1\r\n/;

/**
 * Starts a proxy to kilnd's url; resolves with { url, requests, count,
 * cutAnswer, cutRequest, hold, close }. Each rule applies to the next
 * request that matches it, once, or times times (until r.remove()).
 */
export async function startProxy(upstreamURL) {
  const upstream = new URL(upstreamURL);
  const requests = []; // "METHOD /path?query", in the order they came
  const rules = [];
  const sockets = new Set();
  const connections = []; // { lines, closed }, one for each connection the SDK made
  const listeners = new Set(); // told of each request line
  const server = net.createServer((c) => {
    const u = net.connect(Number(upstream.port), upstream.hostname);
    sockets.add(c).add(u);
    const conn = { lines: [], fromKilnd: 0 };
    conn.closed = new Promise((resolve) => c.on("close", resolve));
    connections.push(conn);
    // What the answer now awaited is to meet, if a rule took its request.
    let rule;
    let held = [];
    const kill = () => {
      c.destroy();
      u.destroy();
    };
    c.on("data", (d) => {
      const m = REQUEST.exec(d.toString("latin1", 0, Math.min(d.length, 4096)));
      if (m) {
        const line = `${m[1]} ${m[2]}`;
        requests.push(line);
        conn.lines.push(line);
        for (const f of listeners) f();
        const i = rules.findIndex((r) => r.method === m[1] && r.path.test(m[2]));
        rule = undefined;
        if (i >= 0) {
          rule = rules[i];
          if (--rule.times === 0) rules.splice(i, 1);
          rule.seen(line);
        }
      }
      // A cut request is cut once kilnd's side has it.
      if (rule?.action === "cut-request") u.write(d, kill);
      else u.write(d);
    });
    u.on("data", (d) => {
      conn.fromKilnd += d.length;
      if (rule?.action === "cut-answer") {
        rule.answered();
        kill();
        return;
      }
      if (rule?.action === "hold") {
        held.push(d);
        if (held.length === 1) {
          rule.answered();
          rule.released.then(() => {
            for (const b of held) c.write(b);
            held = [];
            rule = undefined;
          });
        }
        return;
      }
      c.write(d);
    });
    c.on("end", () => u.end());
    u.on("end", () => c.end());
    c.on("error", kill);
    u.on("error", kill);
    c.on("close", () => sockets.delete(c));
    u.on("close", () => sockets.delete(u));
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));

  function add(action, method, path, times = 1) {
    const r = { action, method, path, times };
    r.remove = () => rules.includes(r) && rules.splice(rules.indexOf(r), 1);
    r.requested = new Promise((resolve) => (r.seen = resolve));
    r.answer = new Promise((resolve) => (r.answered = resolve));
    r.released = new Promise((resolve) => (r.release = resolve));
    rules.push(r);
    return r;
  }

  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    /** How many requests of method had a path matching path. */
    count: (method, path) => requests.filter((l) => l.startsWith(method + " ") && path.test(l.slice(method.length + 1))).length,
    /** Bytes kilnd sent on the connections whose first request's path matches path. */
    bytesFrom: (path) => connections.filter((c) => c.lines.length > 0 && path.test(c.lines[0].split(" ")[1])).reduce((n, c) => n + c.fromKilnd, 0),
    /** Resolves once every connection that carried a request of method whose path matches has closed (one at least). */
    async hungUp(method, path) {
      const matches = () => connections.filter((c) => c.lines.some((l) => l.startsWith(method + " ") && path.test(l.slice(method.length + 1))));
      if (matches().length === 0) {
        await new Promise((resolve) => {
          const f = () => matches().length > 0 && (listeners.delete(f), resolve());
          listeners.add(f);
        });
      }
      await Promise.all(matches().map((c) => c.closed));
    },
    /** The next matching request reaches kilnd; its answer is cut off. r.answer resolves when kilnd answered. */
    cutAnswer: (method, path, times) => add("cut-answer", method, path, times),
    /** The next matching request reaches kilnd and its connection is cut at once, the answer not yet given. */
    cutRequest: (method, path, times) => add("cut-request", method, path, times),
    /** The next matching request's answer is held until r.release(); r.answer resolves when kilnd answered. */
    hold: (method, path) => add("hold", method, path),
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}
