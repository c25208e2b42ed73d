// The test harness: the real fencegw binary on a free loopback port with a
// temporary store, a real upstream (a node http server recording what
// reached it), and a fault proxy between the SDK and the gateway that can
// refuse, hang or cut connections (network faults only: it never makes up
// an answer).
import { spawn, execFileSync } from "node:child_process";
import { once } from "node:events";
import http from "node:http";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../../..");

/** The gateway binary: $FENCEGW_BIN, or built once into a temp dir. */
export function gatewayBin() {
  if (process.env.FENCEGW_BIN) {
    if (!existsSync(process.env.FENCEGW_BIN)) throw new Error(`FENCEGW_BIN=${process.env.FENCEGW_BIN} does not exist`);
    return process.env.FENCEGW_BIN;
  }
  const out = path.join(tmpdir(), "fencegw-sdk-typescript-test", "fencegw");
  execFileSync("go", ["build", "-o", out, "./cmd/fencegw"], { cwd: repo, stdio: "inherit", timeout: 600_000 });
  process.env.FENCEGW_BIN = out;
  return out;
}

/** Waits until cond() is true, checking every few ms; fails after a generous hang limit. */
export async function until(cond, what, limitMs = 20_000) {
  const start = performance.now();
  while (!(await cond())) {
    if (performance.now() - start > limitMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** The signal's abort, as a promise of the instant it fired (performance.now()); fails after a generous hang limit. */
export function aborted(signal, limitMs = 20_000) {
  if (signal.aborted) return Promise.resolve(performance.now());
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the signal did not fire within ${limitMs} ms`)), limitMs);
    signal.addEventListener("abort", () => resolve(performance.now(), clearTimeout(timer)), { once: true });
  });
}

/**
 * An upstream recording every request: method, raw path, body, content
 * type, Fencing-Token, whether Fencing-Lease reached it, Idempotency-Key.
 * /conflict answers its own 409 problem; /hang answers only when the
 * client goes away or the server closes.
 */
export async function startUpstream() {
  const arrivals = [];
  const hanging = new Set();
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      arrivals.push({
        method: req.method,
        path: req.url,
        body,
        contentType: req.headers["content-type"] ?? null,
        token: req.headers["fencing-token"] ?? null,
        hadLease: req.headers["fencing-lease"] !== undefined,
        key: req.headers["idempotency-key"] ?? null,
      });
      if (req.url.startsWith("/hang")) {
        hanging.add(res);
        res.on("close", () => hanging.delete(res));
        return;
      }
      if (req.url.startsWith("/conflict")) {
        res.writeHead(409, { "content-type": "application/problem+json" });
        res.end(JSON.stringify({ type: "https://inventory.example/problems/conflict", title: "Conflict", status: 409, code: "conflict" }));
        return;
      }
      res.writeHead(201, { "content-type": "application/json" });
      res.end(JSON.stringify({ applied: arrivals.length, body }));
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    arrivals,
    /** Arrivals whose path starts with prefix. */
    at: (prefix) => arrivals.filter((a) => a.path.startsWith(prefix)),
    async close() {
      for (const res of hanging) res.destroy();
      server.closeAllConnections();
      server.close();
    },
  };
}

/**
 * The real gateway: `fencegw serve` on 127.0.0.1:0 with a temporary --data,
 * protecting upstream "inventory" (and "dead", where nothing listens).
 */
export async function startGateway(upstreamUrl, args = []) {
  const bin = gatewayBin();
  const data = mkdtempSync(path.join(tmpdir(), "fencegw-ts-"));
  const proc = spawn(
    bin,
    ["serve", "--listen", "127.0.0.1:0", "--data", data, "--shutdown-delay", "0", "--log-level", "warn",
      "--upstream", `inventory=${upstreamUrl}`, "--upstream", "dead=http://127.0.0.1:1", ...args],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let log = "";
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the gateway did not start:\n${log}`)), 30_000);
    const onData = (chunk) => {
      log += chunk;
      const m = /serving on (http:\/\/\S+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    };
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    proc.on("exit", (code) => reject(new Error(`the gateway exited ${code}:\n${log}`)));
  });
  return {
    url,
    proc,
    log: () => log,
    pause: () => proc.kill("SIGSTOP"),
    resume: () => proc.kill("SIGCONT"),
    /** Revokes a lease as an admin would: the holder's next renewal gets lease_lost. */
    async revoke(leaseId) {
      const r = await fetch(`${url}/v1/leases/${encodeURIComponent(leaseId)}/revoke`, { method: "POST" });
      if (r.status !== 200) throw new Error(`revoke: ${r.status} ${await r.text()}`);
    },
    async stop() {
      proc.kill("SIGCONT");
      proc.kill("SIGTERM");
      if (proc.exitCode === null) await once(proc, "exit");
      rmSync(data, { recursive: true, force: true });
    },
  };
}

/**
 * A proxy in front of the gateway. fault(req) picks what happens to each
 * request: "pass", "refuse" (the connection is closed at once), "hang" (no
 * answer until the client gives up) or "cut" (the request is forwarded,
 * the gateway answers, and the connection is closed before the answer is
 * passed on). seen records every request: {path, at (performance.now()),
 * fault, status}.
 */
export async function startProxy(targetUrl) {
  const target = new URL(targetUrl);
  const seen = [];
  const p = {
    fault: () => "pass",
    seen,
    renewals: () => seen.filter((s) => s.path.endsWith("/renew")),
  };
  const agent = new http.Agent({ keepAlive: true });
  const server = http.createServer((req, res) => {
    const rec = { method: req.method, path: req.url, at: performance.now(), fault: p.fault(req), status: 0 };
    seen.push(rec);
    if (rec.fault === "refuse") {
      req.socket.destroy();
      return;
    }
    if (rec.fault === "hang") return;
    const out = http.request(
      { host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers, agent },
      (answer) => {
        const chunks = [];
        answer.on("data", (c) => chunks.push(c));
        answer.on("end", () => {
          rec.status = answer.statusCode;
          if (rec.fault === "cut") {
            req.socket.destroy();
            return;
          }
          res.writeHead(answer.statusCode, answer.headers);
          res.end(Buffer.concat(chunks));
        });
      },
    );
    out.on("error", () => req.socket.destroy());
    req.pipe(out);
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  p.url = `http://127.0.0.1:${server.address().port}`;
  p.close = async () => {
    server.closeAllConnections();
    server.close();
    agent.destroy();
  };
  return p;
}

/** A loopback URL where nothing listens. */
export async function closedUrl() {
  const s = http.createServer();
  s.listen(0, "127.0.0.1");
  await once(s, "listening");
  const url = `http://127.0.0.1:${s.address().port}`;
  s.close();
  await once(s, "close");
  return url;
}

let seq = 0;
/** A resource name unique to this run. */
export function resource(name) {
  return `inventory/${name}-${process.pid}-${++seq}`;
}
