// The client's apiKey against a gateway with --auth-file: every call, the
// fenced writes included, carries it; refusals keep the gateway's code.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { Client, FencegwError, LeaseLostError, UnavailableError } from "../dist/index.js";
import { startGateway, startUpstream, until, resource } from "./harness.mjs";

const key = `fgk_${randomBytes(24).toString("base64url")}`;
let up, gw, dir;
before(async () => {
  dir = mkdtempSync(path.join(tmpdir(), "fencegw-ts-auth-"));
  const file = path.join(dir, "auth.yaml");
  const sha = createHash("sha256").update(key).digest("hex");
  writeFileSync(file, `keys:\n  - name: pods\n    sha256: ${sha}\n    role: worker\n    resources: ["inventory/"]\n`, { mode: 0o600 });
  up = await startUpstream();
  gw = await startGateway(up.url, ["--auth-file", file]);
});
after(async () => {
  await gw?.stop();
  await up?.close();
  rmSync(dir, { recursive: true, force: true });
});

test("apiKey is sent on acquire, renew, fenced writes and release", async () => {
  const c = new Client(gw.url, { holder: "auth", apiKey: key });
  const lease = await c.acquire(resource("auth"), { ttlMs: 1500 });
  const first = lease.deadline;
  const r = await lease.request("PUT", "inventory", "/stock/auth", { body: "1" });
  assert.equal(r.status, 201);
  await r.arrayBuffer();
  await until(() => lease.deadline > first || lease.signal.aborted, "a renewal");
  assert.equal(lease.signal.aborted, false, "renewed with the key");
  await lease.release();
  assert.equal(lease.signal.aborted, false);
});

test("without a key, or outside its resources, the gateway's code is carried", async () => {
  const anon = new Client(gw.url, { holder: "anon" });
  const e1 = await anon.acquire(resource("auth"), { ttlMs: 1000 }).catch((e) => e);
  assert.ok(e1 instanceof FencegwError && !(e1 instanceof LeaseLostError) && !(e1 instanceof UnavailableError), String(e1));
  assert.equal(e1.code, "unauthorized");
  assert.equal(e1.status, 401);
  const c = new Client(gw.url, { holder: "auth", apiKey: key });
  const e2 = await c.acquire("payroll/1", { ttlMs: 1000 }).catch((e) => e);
  assert.equal(e2.constructor, FencegwError);
  assert.equal(e2.code, "forbidden");
});
